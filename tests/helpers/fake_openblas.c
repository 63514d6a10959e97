/* A stand-in OpenBLAS for the --warm thread rule, with the symbol names of numpy's wheels
   (scipy_ prefix, 64_ suffix). As the real one, it starts its pool of idle threads when it is
   loaded, sized by the first positive of OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS and
   OMP_NUM_THREADS, else one per online CPU; set_num_threads grows the pool. get_num_threads
   reports the size. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static int pool = 1; /* the calling thread counts as one, as in OpenBLAS */

static void* idle(void* arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static void grow(int n) {
  for (; pool < n; ++pool) {
    pthread_t t;
    if (pthread_create(&t, NULL, idle, NULL) != 0) return;
    pthread_detach(t);
  }
}

static int from_environment(void) {
  static const char* const names[] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    const char* v = getenv(names[i]);
    if (v && atoi(v) > 0) return atoi(v);
  }
  return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

__attribute__((constructor)) static void load(void) { grow(from_environment()); }

void scipy_openblas_set_num_threads64_(int n) { grow(n); }
int scipy_openblas_get_num_threads64_(void) { return pool; }
