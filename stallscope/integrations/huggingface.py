"""Hugging Face: ``Trainer(..., callbacks=[StallscopeCallback()])`` for transformers,
``loader = watch_prepared(accelerator.prepare(loader))`` for accelerate loops; the rank
identity comes from Accelerate's state.

accelerate's ``prepare`` returns a ``DataLoaderShard`` around a DataLoader it builds
(``base_dataloader``); its ``__iter__`` is a generator over that DataLoader's iterator.
``watch()`` of the shard times the loop's ``next()`` on the shard and finds the
DataLoader's own iterator behind the generator (hook/claim.py). The Trainer keeps its
loader in a local variable, so its callback cannot hand back a wrapper: it watches the
shard's ``base_dataloader`` in place instead (the shard iterates it once an epoch).
"""
from __future__ import annotations

import warnings
from typing import Any

from transformers import TrainerCallback

import stallscope


def identity() -> dict[str, int]:
    """This process's rank as Accelerate knows it (torchrun, SLURM, MPI, or one process)."""
    from accelerate import PartialState

    state = PartialState()
    return {"rank": int(state.process_index), "local_rank": int(state.local_process_index),
            "world_size": int(state.num_processes)}


def watch_prepared(loader: Any, **watch_kwargs: object) -> Any:
    """``stallscope.watch`` of a loader from ``accelerator.prepare``, with Accelerate's rank."""
    return stallscope.watch(loader, **dict(identity(), **watch_kwargs))


class StallscopeCallback(TrainerCallback):
    """Watch the Trainer's train dataloader; ``watch_kwargs`` go to ``stallscope.watch``."""

    def __init__(self, **watch_kwargs: object) -> None:
        self.watch_kwargs = watch_kwargs

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        if train_dataloader is None:
            return
        base = getattr(train_dataloader, "base_dataloader", None)
        if base is None:
            warnings.warn("stallscope: the Trainer's train dataloader (%s) has no base_dataloader "
                          "to watch in place; wrap it with stallscope.watch in get_train_dataloader"
                          % type(train_dataloader).__name__, RuntimeWarning, stacklevel=2)
            return
        kw = dict(rank=args.process_index, local_rank=args.local_process_index,
                  world_size=args.world_size, **self.watch_kwargs)
        train_dataloader.base_dataloader = stallscope.watch(base, **kw)
