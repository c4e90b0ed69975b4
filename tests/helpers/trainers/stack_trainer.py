"""A DataLoader whose workers sit in one known place, for the py-spy stack tests.

--mode fetch:   workers sleep in ``fetch_remote_shard`` (a stand-in for an object-store GET)
--mode read:    workers block reading a FIFO (--fifo) that nobody writes to
--mode decode:  workers decode a PNG with PIL in a loop, inside ``decode_sample``
--mode collate: the collate_fn ``slow_collate`` sleeps
--mode idle:    samples are instant and the loop sits in ``train_step``: workers idle
The workers never finish: the test kills the process group.
"""
import argparse
import io
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the repository root
import stallscope


def fetch_remote_shard(i):
    time.sleep(3600)
    return i


def decode_sample(png):
    from PIL import Image
    while True:
        img = Image.open(io.BytesIO(png))
        img.load()
        time.sleep(0.03)


def slow_collate(batch):
    time.sleep(3600)
    return batch


def train_step(batch):
    time.sleep(3600)


class StuckDataset:
    def __init__(self, mode, fifo=None):
        self.mode, self.fifo = mode, fifo
        self.png = None
        if mode == "decode":
            from PIL import Image
            buf = io.BytesIO()
            Image.effect_noise((384, 384), 64).save(buf, format="PNG")
            self.png = buf.getvalue()

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        if self.mode == "fetch":
            return fetch_remote_shard(i)
        if self.mode == "read":
            with open(self.fifo, "rb") as f:
                return len(f.read(1 << 16))
        if self.mode == "decode":
            return decode_sample(self.png)
        return i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=("fetch", "read", "decode", "collate", "idle"))
    p.add_argument("--fifo")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    from torch.utils.data import DataLoader
    kw = {"collate_fn": slow_collate} if a.mode == "collate" else {}
    loader = stallscope.watch(DataLoader(StuckDataset(a.mode, a.fifo), batch_size=2,
                                         num_workers=a.workers, **kw))
    for batch in loader:
        train_step(batch)


if __name__ == "__main__":
    main()
