// The worker of bench/health/health_bench.py (run under ctrun; not a test).
//   cost N PACE_US OUT              beat N times through the worker library, PACE_US apart
//                                   (nanosleep), timing each call; writes
//                                   "<mean_ns> <p50_ns> <p99_ns> <cpu_ns_per_beat>" to OUT.<RANK>
//                                   (CPU: the paced loop's thread CPU time with beats minus the
//                                   same loop's without them, per beat)
//   hang PACE_MS HANG_RANK AFTER_MS OUT
//                                   beat every PACE_MS; rank HANG_RANK stops beating after AFTER_MS
//                                   and sleeps. Every rank writes "term <ns>" (CLOCK_MONOTONIC when
//                                   SIGTERM arrived) and the hung rank "last <ns>" (its last beat)
//                                   to OUT.<RANK>.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ctrun/heartbeat.h"

namespace {

long long Now(clockid_t c = CLOCK_MONOTONIC) {
  timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

volatile sig_atomic_t g_term = 0;
long long g_term_ns = 0;

void OnTerm(int) {
  g_term_ns = Now();  // clock_gettime is async-signal-safe
  g_term = 1;
}

void SleepNs(long long ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000LL), static_cast<long>(ns % 1000000000LL)};
  nanosleep(&ts, nullptr);  // EINTR (SIGTERM) ends it early, as wanted
}

std::string OutPath(const char* base) {
  const char* r = getenv("RANK");
  return std::string(base) + "." + (r ? r : "0");
}

// The same paced loop twice, with and without the beat: the CPU time per beat is the difference
// (the pacing's own nanosleep and the timing calls cancel out).
long long LoopCpu(long n, long pace_us, bool beat, std::vector<long long>* t) {
  const long long cpu0 = Now(CLOCK_THREAD_CPUTIME_ID);
  for (long i = 0; i < n; ++i) {
    const long long a = Now();
    if (beat) ctrun::heartbeat(static_cast<uint64_t>(i));
    (*t)[static_cast<size_t>(i)] = Now() - a;
    if (pace_us > 0) SleepNs(pace_us * 1000LL);
  }
  return Now(CLOCK_THREAD_CPUTIME_ID) - cpu0;
}

int Cost(long n, long pace_us, const char* out) {
  std::vector<long long> t(static_cast<size_t>(n)), idle(static_cast<size_t>(n));
  const long long cpu_idle = LoopCpu(n, pace_us, false, &idle);
  const long long cpu = LoopCpu(n, pace_us, true, &t) - cpu_idle;
  long long sum = 0;
  for (long long x : t) sum += x;
  std::sort(t.begin(), t.end());
  FILE* f = fopen(OutPath(out).c_str(), "w");
  if (!f) return 1;
  fprintf(f, "%lld %lld %lld %lld\n", sum / n, t[t.size() / 2], t[t.size() * 99 / 100], cpu / n);
  fclose(f);
  return 0;
}

int Hang(long pace_ms, int hang_rank, long after_ms, const char* out) {
  signal(SIGTERM, OnTerm);
  const char* r = getenv("RANK");
  const bool hangs = r && atoi(r) == hang_rank;
  const long long start = Now();
  long long last = 0;
  uint64_t step = 0;
  while (!g_term) {
    if (hangs && Now() - start >= after_ms * 1000000LL) {
      while (!g_term) pause();
      break;
    }
    ctrun::heartbeat(++step);
    last = Now();
    SleepNs(pace_ms * 1000000LL);
  }
  FILE* f = fopen(OutPath(out).c_str(), "w");
  if (!f) return 1;
  fprintf(f, "term %lld\n", g_term_ns);
  if (hangs) fprintf(f, "last %lld\n", last);
  fclose(f);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "cost" && argc == 5) return Cost(atol(argv[2]), atol(argv[3]), argv[4]);
  if (mode == "hang" && argc == 6) return Hang(atol(argv[2]), atoi(argv[3]), atol(argv[4]), argv[5]);
  fprintf(stderr, "usage: %s cost N PACE_US OUT | hang PACE_MS HANG_RANK AFTER_MS OUT\n", argv[0]);
  return 64;
}
