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

``on_cpu`` (``batch_unpickle_cpu_s``) spends the cost on the CPU instead, as a real
unpickle does: the training process's own work inside ``next()``, which a CPU limit on
that process stretches while its idle workers have batches ready (the lab's
trainer-throttled scenario, issue 30).
"""
import time


def _arrive(seconds, on_cpu=False):
    # Runs in the training process, as the batch is unpickled off the worker queue.
    if on_cpu:
        end = time.thread_time() + seconds  # this thread's CPU time: a throttle stretches it
        while time.thread_time() < end:
            pass
    else:
        time.sleep(seconds)
    return seconds


class ArrivalCost:
    """Pickles in the worker as a call that takes ``seconds`` to unpickle (asleep, or on
    the CPU with ``on_cpu``)."""

    def __init__(self, seconds, on_cpu=False):
        self.seconds, self.on_cpu = seconds, on_cpu

    def __reduce__(self):
        return _arrive, (self.seconds, self.on_cpu)


def with_cost(collate, seconds, on_cpu=False):
    """``collate`` whose batches go out as (batch, ArrivalCost(seconds, on_cpu))."""
    def collate_with_cost(samples):
        return collate(samples), ArrivalCost(seconds, on_cpu)
    return collate_with_cost
