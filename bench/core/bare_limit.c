/* The bare limit of ctrun's cold path on this machine: the same process work in plain C, with
 * nothing a launcher adds (no log directory, no cgroup, no store, no output pipes). It follows
 * ../shared/bench/restart_limit.c (posix_spawn, kill, reap) but speaks restart_worker.c's
 * protocol, so ctrun and this program run the same worker and are timed the same way.
 *
 *   bare_limit launch N PROG [ARG...]   posix_spawn N x PROG, reap them all
 *   bare_limit restart N WORKER DIR     attempt 0: N x WORKER DIR (RANK, WORLD_SIZE,
 *                                       TORCHELASTIC_RESTART_COUNT=0); when the first worker exits,
 *                                       SIGKILL and reap the others, then N x WORKER DIR of attempt 1,
 *                                       reap them all
 * Exit code: 0, or 2 on bad usage / a failed spawn. */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char** environ;

static char** env_with(int attempt, int rank, int world) {
  int n = 0;
  while (environ[n]) n++;
  char** e = calloc((size_t)n + 4, sizeof *e);
  memcpy(e, environ, (size_t)n * sizeof *e);
  e[n] = malloc(64);
  e[n + 1] = malloc(32);
  e[n + 2] = malloc(32);
  snprintf(e[n], 64, "TORCHELASTIC_RESTART_COUNT=%d", attempt);
  snprintf(e[n + 1], 32, "RANK=%d", rank);
  snprintf(e[n + 2], 32, "WORLD_SIZE=%d", world);
  return e;
}

static int spawn_all(int n, pid_t* p, char** av, int attempt) {
  for (int i = 0; i < n; i++)
    if (posix_spawn(&p[i], av[0], 0, 0, av, env_with(attempt, i, n)) != 0) return -1;
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const int n = atoi(argv[2]);
  if (n <= 0) return 2;
  pid_t* p = calloc((size_t)n, sizeof *p);
  if (strcmp(argv[1], "launch") == 0) {
    if (spawn_all(n, p, argv + 3, 0) != 0) return 2;
    while (wait(0) > 0) {}
    return 0;
  }
  if (strcmp(argv[1], "restart") != 0 || argc != 5) return 2;
  char* av[] = {argv[3], argv[4], 0};
  if (spawn_all(n, p, av, 0) != 0) return 2;
  const pid_t first = wait(0);  /* the failing worker (restart_worker.c: rank 0) */
  for (int i = 0; i < n; i++)
    if (p[i] != first) kill(p[i], SIGKILL);
  for (int i = 0; i < n; i++)
    if (p[i] != first) waitpid(p[i], 0, 0);
  if (spawn_all(n, p, av, 1) != 0) return 2;
  while (wait(0) > 0) {}
  return 0;
}
