"""The framework trainers' shared parts: a dataset whose samples take a known time
(sleep, so the cost does not depend on how loaded the machine is), a step of a known
compute time, and the end of a run: flush, then stay alive until the test's done-file
appears (the agent keeps a rank while its process lives)."""
import os
import time

import torch
from torch.utils.data import Dataset


class SlowSamples(Dataset):
    def __init__(self, n, sample_s, as_dict=False):
        self.n, self.sample_s, self.as_dict = n, sample_s, as_dict

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sample_s)
        x, y = torch.full((4,), float(i % 7)), torch.tensor([float(i % 3)])
        return {"x": x, "labels": y} if self.as_dict else (x, y)


def compute(seconds):
    time.sleep(seconds)  # the step's "GPU" time


class SlowBackward(torch.autograd.Function):
    """The identity forward; its backward takes ``seconds`` (the step's backward "GPU" time)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


def slow_backward(x, seconds):
    return SlowBackward.apply(x, seconds) if seconds else x


def linger(cfg):
    from stallscope.hook import channel

    channel.get().flush()
    deadline = time.monotonic() + cfg.get("linger_s", 120)
    while not os.path.exists(cfg["done_file"]) and time.monotonic() < deadline:
        time.sleep(0.2)
