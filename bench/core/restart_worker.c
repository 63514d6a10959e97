/* Worker for the failure -> all-restarted latency benchmark.
 * Attempt 0: every rank creates <dir>/up.<rank> and sleeps; rank 0 waits until all N are up,
 * records CLOCK_MONOTONIC in <dir>/fail_ns and exits 1 (the failure).
 * Attempt 1: every rank records CLOCK_MONOTONIC at entry in <dir>/start.<rank> and exits 0.
 * Latency = max(start.*) - fail_ns (CLOCK_MONOTONIC is system-wide, so comparable). */
#include <fcntl.h>
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

static void write_ns(const char* path, long long v) {
  FILE* f = fopen(path, "w");
  if (f) {
    fprintf(f, "%lld\n", v);
    fclose(f);
  }
}

int main(int argc, char** argv) {
  long long t = now_ns();
  if (argc < 2) return 64;
  const char* dir = argv[1];
  const char* r = getenv("RANK");
  const char* a = getenv("TORCHELASTIC_RESTART_COUNT");
  const char* w = getenv("WORLD_SIZE");
  if (!r || !a || !w) return 65;
  char path[4096];
  if (atoi(a) > 0) {
    snprintf(path, sizeof path, "%s/start.%s", dir, r);
    write_ns(path, t);
    return 0;
  }
  snprintf(path, sizeof path, "%s/up.%s", dir, r);
  close(open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  if (strcmp(r, "0") != 0) {
    for (;;) pause();
  }
  int n = atoi(w);
  for (;;) {
    int up = 0;
    for (int i = 0; i < n; ++i) {
      struct stat st;
      snprintf(path, sizeof path, "%s/up.%d", dir, i);
      up += stat(path, &st) == 0;
    }
    if (up == n) break;
    usleep(1000);
  }
  snprintf(path, sizeof path, "%s/fail_ns", dir);
  write_ns(path, now_ns());
  return 1;
}
