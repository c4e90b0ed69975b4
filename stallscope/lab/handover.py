"""A per-batch cost in the training process's share of the transfer (lab/trainer.py's
``batch_unpickle_s``).

Batches often carry more than tensors: per-sample records, strings, dicts of metadata,
which the training process unpickles as each batch arrives from a worker, inside
``next()`` after the batch was ready: a transfer cost (hook/transfer.py) that more
workers, quota or faster storage do not remove. The lab makes that cost a fixed wait
(``ArrivalCost``), slept rather than spent on the CPU, so it stays the same share of a
step on a machine loaded by others: a scenario can then put a rank's own wait just over
the line and know by how much (many tensors a sample do the same, but their cost grows
several-fold with the machine's load).
"""
import time


def _arrive(seconds):
    # Runs in the training process, as the batch is unpickled off the worker queue.
    time.sleep(seconds)
    return seconds


class ArrivalCost:
    """Pickles in the worker as a call that takes ``seconds`` to unpickle."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return _arrive, (self.seconds,)


def with_cost(collate, seconds):
    """``collate`` whose batches go out as (batch, ArrivalCost(seconds))."""
    def collate_with_cost(samples):
        return collate(samples), ArrivalCost(seconds)
    return collate_with_cost
