"""MosaicML Composer: ``Trainer(..., callbacks=[StallscopeCallback()])`` watches the train
dataloader at each epoch's start, with the rank identity from Composer's ``dist``
(its launcher's RANK / LOCAL_RANK / WORLD_SIZE).

Composer's fit loop reads ``state.dataloader`` right after the ``EPOCH_START`` event and
only then calls ``iter()`` on it (``Trainer._iter_dataloader``, through
``itertools.islice`` when the length is known), so the callback swaps the watched loader
in there: every epoch's batches go through it, workers' reports included. Evaluation
saves ``state.dataloader`` and puts it back afterwards, so the watched loader survives
it; a loader handed to a later ``fit(train_dataloader=...)`` is watched at its first
epoch. A ``StreamingDataset`` inside the loader reports its shard downloads and cache
hits through the hook's Streaming adapter (stallscope/hook/adapters/streaming.py).
"""
from __future__ import annotations

from typing import Any

from composer.core import Callback
from composer.utils import dist

import stallscope


def identity() -> dict[str, int]:
    """This process's rank as Composer knows it (its launcher's environment, or one process)."""
    return {"rank": int(dist.get_global_rank()), "local_rank": int(dist.get_local_rank()),
            "world_size": int(dist.get_world_size())}


class StallscopeCallback(Callback):
    """Watch the Trainer's train dataloader; ``watch_kwargs`` go to ``stallscope.watch``
    (``job=...`` names the run; the rank comes from Composer's dist)."""

    def __init__(self, **watch_kwargs: object) -> None:
        self.watch_kwargs = watch_kwargs

    def epoch_start(self, state: Any, logger: Any) -> None:
        loader = state.dataloader
        # EPOCH_START only fires in the fit loop, where the active loader is the train one;
        # checked anyway, so an evaluation loader is never watched as if it were training's.
        if loader is None or stallscope.unwatch(loader) is not stallscope.unwatch(state.train_dataloader):
            return
        watched = stallscope.watch(loader, **dict(identity(), **self.watch_kwargs))
        if watched is loader:
            return  # watched at an earlier epoch (watch() returns a watched loader unchanged)
        length = state.dataloader_len  # None (unknown) or a Time in batches: kept as it was
        state.set_dataloader(watched, state.dataloader_label, -1 if length is None else length)
        state.train_dataloader = watched
