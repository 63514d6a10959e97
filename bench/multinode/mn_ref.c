/* The bare process cost on this machine, for bench/multinode/multinode_bench.py: what any launcher
 * would at least pay, with the same worker and the same timestamp files.
 *
 *   mn_ref spawn N WORKER DIR  prints CLOCK_MONOTONIC ns, then posix_spawns N workers in "start"
 *                              mode (RANK 0..N-1, WORLD_SIZE N, attempt 0) and reaps them:
 *                              max(start.*) - printed time = the cost of starting N processes.
 *   mn_ref stop N WORKER DIR   posix_spawns N workers in "fail" mode (rank N-1 fails), waits for the
 *                              failing one, SIGTERMs the others, reaps them:
 *                              max(stop.*) - fail = the cost of noticing an exit and stopping N-1. */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char** environ;

static char** env_for(int rank, int n) {
  int k = 0;
  while (environ[k]) k++;
  char** e = calloc((size_t)k + 4, sizeof *e);
  int j = 0;
  for (int i = 0; i < k; i++) {
    if (strncmp(environ[i], "RANK=", 5) && strncmp(environ[i], "WORLD_SIZE=", 11) &&
        strncmp(environ[i], "TORCHELASTIC_RESTART_COUNT=", 27))
      e[j++] = environ[i];
  }
  char* r = malloc(32);
  char* w = malloc(32);
  snprintf(r, 32, "RANK=%d", rank);
  snprintf(w, 32, "WORLD_SIZE=%d", n);
  e[j++] = r;
  e[j++] = w;
  e[j++] = "TORCHELASTIC_RESTART_COUNT=0";
  return e;
}

int main(int argc, char** argv) {
  if (argc < 5) return 64;
  int n = atoi(argv[2]);
  const char* worker = argv[3];
  const char* dir = argv[4];
  pid_t* p = calloc((size_t)n, sizeof *p);
  char fail_rank[16];
  snprintf(fail_rank, sizeof fail_rank, "%d", n - 1);
  char*** envs = calloc((size_t)n, sizeof *envs);
  for (int i = 0; i < n; i++) envs[i] = env_for(i, n);
  if (strcmp(argv[1], "spawn") == 0) {
    char* av[] = {(char*)worker, (char*)dir, "start", 0};
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%lld\n", ts.tv_sec * 1000000000LL + ts.tv_nsec);
    fflush(stdout);
    for (int i = 0; i < n; i++)
      if (posix_spawn(&p[i], worker, 0, 0, av, envs[i]) != 0) return 1;
    while (wait(0) > 0) {
    }
    return 0;
  }
  if (strcmp(argv[1], "stop") == 0) {
    char* av[] = {(char*)worker, (char*)dir, "fail", fail_rank, 0};
    for (int i = 0; i < n; i++)
      if (posix_spawn(&p[i], worker, 0, 0, av, envs[i]) != 0) return 1;
    waitpid(p[n - 1], 0, 0);
    for (int i = 0; i < n - 1; i++) kill(p[i], SIGTERM);
    while (wait(0) > 0) {
    }
    return 0;
  }
  return 64;
}
