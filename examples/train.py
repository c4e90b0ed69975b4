"""The README's single-machine example: a real DataLoader with worker processes feeding a
training step of fixed cost. `--slow` makes each sample cost 60 ms (2 workers, 8 samples
a batch: a batch every 240 ms against 150 ms of compute), so the loop waits on its loader.

    stallscope run -- python examples/train.py --slow
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stallscope


class Samples(Dataset):
    def __init__(self, n, cost_s):
        self.n, self.cost_s = n, cost_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.cost_s)  # decoding, augmenting ... (sleep: the same on any machine)
        return torch.full((16,), float(i % 10)), torch.tensor(float(i % 2))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--slow", action="store_true", help="60 ms a sample instead of 2 ms")
    p.add_argument("--batches", type=int, default=80)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--exit-status", type=int, default=0, help="exit with this status at the end")
    p.add_argument("--tag", default="", help="ignored (lets a test find this process)")
    p.add_argument("--job", default=None, help="name the job (stallscope.watch(loader, job=...))")
    p.add_argument("--step-seconds", type=float, default=0.15, help="the rest of each step")
    p.add_argument("--log-every", type=int, default=0, help="print a log line every N batches")
    p.add_argument("--progress", action="store_true", help="show a tqdm progress bar (pip install tqdm)")
    args = p.parse_args()
    cost = 0.06 if args.slow else 0.002
    loader = DataLoader(Samples(args.batches * 8, cost), batch_size=8, num_workers=args.workers)
    loader = stallscope.watch(loader, job=args.job) if args.job else stallscope.watch(loader)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = loader
    def say(text):
        print(text, flush=True)
    if args.progress:
        from tqdm import tqdm

        batches, say = tqdm(loader, desc="train", unit="batch"), tqdm.write  # type: ignore[assignment]
    for i, (x, y) in enumerate(batches):
        if args.log_every and i % args.log_every == 0:
            say("train: batch %d" % i)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_seconds)  # the rest of the step (on a GPU: the forward and backward)
    raise SystemExit(args.exit_status)


if __name__ == "__main__":
    main()
