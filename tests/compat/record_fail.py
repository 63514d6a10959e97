# A worker that raises under @record: its traceback must appear in the launcher's summary.
import os

from torch.distributed.elastic.multiprocessing.errors import record


def load_batch(i):
    raise ValueError(f"corrupt sample {i} on rank {os.environ['RANK']}")


@record
def main():
    if os.environ["RANK"] == "1":
        load_batch(1234)


if __name__ == "__main__":
    main()
