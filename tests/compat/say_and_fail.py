# One line on stdout and one on stderr, naming the rank and the attempt; rank 1 then exits 3 in
# every attempt before attempt argv[1] (0: never).
import os
import sys

rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("out rank %s attempt %d" % (rank, attempt), flush=True)
print("err rank %s attempt %d" % (rank, attempt), file=sys.stderr, flush=True)
if rank == "1" and attempt < int(sys.argv[1]):
    sys.exit(3)
