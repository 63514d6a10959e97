/* Worker of bench/multinode/multinode_bench.py. Every timestamp is CLOCK_MONOTONIC in ns, which is
 * system-wide, so stamps written by workers of different agents (and by the benchmark) compare.
 *
 *   mn_worker DIR start          writes DIR/start.<attempt>.<rank> = "<ns> <world>" at entry, exits 0.
 *   mn_worker DIR fail FAILRANK  before the failure (no DIR/fail yet, attempt 0): writes DIR/up.<rank>,
 *                                then waits (pause) with a SIGTERM handler that writes
 *                                DIR/stop.<rank> = "<ns>" and dies of SIGTERM; rank FAILRANK waits
 *                                until WORLD_SIZE up.* files exist, writes DIR/fail = "<ns>" and
 *                                exits 1. After the failure: as "start".
 *   mn_worker DIR hang WORLD     writes DIR/start.<attempt>.<rank>.<pid> = "<ns> <world>" at entry;
 *                                waits for a signal while WORLD_SIZE == WORLD, else exits 0.
 * Every file is written under a temporary name and renamed, so a reader never sees half of one. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Async-signal-safe: no stdio. */
static void put_ll(char* buf, long long v) {
  char tmp[32];
  int n = 0;
  if (v == 0) tmp[n++] = '0';
  while (v > 0) {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  }
  int i = 0;
  while (n > 0) buf[i++] = tmp[--n];
  buf[i] = 0;
}

static void write_file(const char* path, const char* tmp_path, const char* text) {
  int fd = open(tmp_path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t left = (ssize_t)strlen(text);
  const char* p = text;
  while (left > 0) {
    ssize_t w = write(fd, p, (size_t)left);
    if (w <= 0) break;
    p += w;
    left -= w;
  }
  close(fd);
  rename(tmp_path, path);
}

static char g_stop_path[4096], g_stop_tmp[4096];

static void on_sigterm(int sig) {
  char text[40];
  put_ll(text, now_ns());
  write_file(g_stop_path, g_stop_tmp, text);
  signal(sig, SIG_DFL);
  raise(sig);
}

static void write_stamp(const char* dir, const char* name, long long t, const char* world) {
  char path[4096], tmp[4200], text[80];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.tmp.%s", dir, name);
  snprintf(text, sizeof text, "%lld %s\n", t, world ? world : "");
  write_file(path, tmp, text);
}

int main(int argc, char** argv) {
  long long t = now_ns();
  if (argc < 3) return 64;
  const char* dir = argv[1];
  const char* mode = argv[2];
  const char* rank = getenv("RANK");
  const char* attempt = getenv("TORCHELASTIC_RESTART_COUNT");
  const char* world = getenv("WORLD_SIZE");
  if (!rank || !attempt || !world) return 65;
  char name[256];

  if (strcmp(mode, "hang") == 0) {
    if (argc < 4) return 64;
    snprintf(name, sizeof name, "start.%s.%s.%d", attempt, rank, (int)getpid());
    write_stamp(dir, name, t, world);
    if (atoi(world) != atoi(argv[3])) return 0;
    for (;;) pause();
  }
  char fail_path[4096];
  struct stat fail_st;
  snprintf(fail_path, sizeof fail_path, "%s/fail", dir);
  /* Attempt 0 is the one before the failure: torchrun counts restarts per node, so a node restarted
   * because another one failed starts attempt 0 again. */
  if (strcmp(mode, "fail") == 0 && atoi(attempt) == 0 && stat(fail_path, &fail_st) != 0) {
    if (argc < 4) return 64;
    snprintf(g_stop_path, sizeof g_stop_path, "%s/stop.%s", dir, rank);
    snprintf(g_stop_tmp, sizeof g_stop_tmp, "%s/.tmp.stop.%s", dir, rank);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    snprintf(name, sizeof name, "up.%s", rank);
    write_stamp(dir, name, t, world);
    if (strcmp(rank, argv[3]) != 0) {
      for (;;) pause();
    }
    int n = atoi(world);
    for (;;) {
      int up = 0;
      for (int i = 0; i < n; ++i) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/up.%d", dir, i);
        up += stat(path, &st) == 0;
      }
      if (up == n) break;
      usleep(1000);
    }
    /* Let every worker settle into pause() before the failure. */
    usleep(200000);
    write_stamp(dir, "fail", now_ns(), world);
    return 1;
  }
  if (strcmp(mode, "start") == 0 || strcmp(mode, "fail") == 0) {
    snprintf(name, sizeof name, "start.%s.%s", attempt, rank);
    write_stamp(dir, name, t, world);
    return 0;
  }
  return 64;
}
