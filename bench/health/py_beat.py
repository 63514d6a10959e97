# Heartbeat cost from Python (bench/health/health_bench.py): the README's two lines, N beats PACE_US
# apart, each timed with perf_counter_ns (its own ~0.1 us included); writes
# "<mean_ns> <p50_ns> <p99_ns> <cpu_ns_per_beat>" to OUT.<RANK>.
import os
import sys
import time

n, pace_us, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import os; hb = os.environ.get("CTRUN_HEARTBEAT_FD")
times = []
cpu0 = time.thread_time_ns()
for step in range(n):
    a = time.perf_counter_ns()
    if hb: os.write(int(hb), b"%d\n" % step)
    times.append(time.perf_counter_ns() - a)
    if pace_us:
        time.sleep(pace_us / 1e6)
cpu = (time.thread_time_ns() - cpu0) // n  # includes the loop and time.sleep's own CPU
times.sort()
with open(f"{out}.{os.environ.get('RANK', '0')}", "w") as f:
    f.write(f"{sum(times) // n} {times[n // 2]} {times[n * 99 // 100]} {cpu}\n")
