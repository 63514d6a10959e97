# Heartbeat cost from Python (bench/health/health_bench.py): the README's lines, N beats PACE_US
# apart, each timed with perf_counter_ns (its own ~0.1 us included); writes
# "<mean_ns> <p50_ns> <p99_ns> <cpu_ns_per_beat>" to OUT.<RANK> (CPU: thread CPU time of the paced
# loop with beats minus the same loop without them, per beat).
import os
import sys
import time

n, pace_us, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import os; hb = os.environ.get("CTRUN_HEARTBEAT_FD")       # the README's three start-up lines
try: s = os.fstat(int(hb)); hb = int(hb) if f"{s.st_dev}:{s.st_ino}" == os.environ.get("CTRUN_HEARTBEAT_ID") else None
except (TypeError, ValueError, OSError): hb = None          # no channel, or fd 3 is not ctrun's
def loop(beat):
    times = []
    cpu0 = time.thread_time_ns()
    for step in range(n):
        a = time.perf_counter_ns()
        if beat and hb is not None: os.write(hb, b"%d\n" % step)
        times.append(time.perf_counter_ns() - a)
        if pace_us:
            time.sleep(pace_us / 1e6)
    return times, time.thread_time_ns() - cpu0


_, cpu_idle = loop(False)
times, cpu_beat = loop(True)
cpu = max(0, cpu_beat - cpu_idle) // n  # the same loop with and without the beat
times.sort()
with open(f"{out}.{os.environ.get('RANK', '0')}", "w") as f:
    f.write(f"{sum(times) // n} {times[n // 2]} {times[n * 99 // 100]} {cpu}\n")
