"""Ray Train: ``for batch in watch_shard(ray.train.get_dataset_shard("train").iter_torch_batches(...))``
inside the training function; the rank identity comes from ``ray.train.get_context()``.

Ray Data makes the batches in its own tasks and actors (other processes, scheduled by Ray),
and ``iter_torch_batches`` hands the loop an iterable of batches already made: the hook
measures the per-batch data-wait of each rank and the rank from Ray Train's context, and
says once that nothing more is introspected (hook/loaders.py): no worker count, no worker
PIDs, no batch load times, no ready/transfer split.
"""
from __future__ import annotations

from typing import Any

import stallscope


def identity() -> dict[str, int]:
    """This worker's rank as Ray Train knows it (its world rank, local rank and size)."""
    import ray.train

    ctx = ray.train.get_context()
    return {"rank": int(ctx.get_world_rank()), "local_rank": int(ctx.get_local_rank()),
            "world_size": int(ctx.get_world_size())}


def watch_shard(batches: Any, **watch_kwargs: object) -> Any:
    """``stallscope.watch`` of a Ray Data iterable (``iter_torch_batches``, ``iter_batches``,
    a ``DataIterator``) with Ray Train's rank; ``watch_kwargs`` go to ``stallscope.watch``."""
    return stallscope.watch(batches, **dict(identity(), **watch_kwargs))
