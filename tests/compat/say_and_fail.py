# One line on stdout and one on stderr, naming the rank and the attempt; rank 1 then exits 3 in
# every attempt before attempt argv[1] (0: never), once rank 0 has said its lines: rank 0 marks
# that with a file in the directory argv[2]. (A launcher stops the other ranks as soon as one
# fails: without the wait, rank 0 could be stopped before its lines.)
import os
import sys
import time

rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
until, sync_dir = int(sys.argv[1]), sys.argv[2]
said = os.path.join(sync_dir, "said.%d" % attempt)
print("out rank %s attempt %d" % (rank, attempt), flush=True)
print("err rank %s attempt %d" % (rank, attempt), file=sys.stderr, flush=True)
if rank == "0":
    open(said, "w").close()
if rank == "1" and attempt < until:
    deadline = time.monotonic() + 120
    while not os.path.exists(said) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(3)
