"""PyTorch Lightning: ``Trainer(callbacks=[StallscopeCallback()])`` watches the train
dataloader(s) the Trainer builds, with the rank identity from the Trainer.

Lightning builds its train loaders and already calls ``iter()`` on them inside the fit
loop's ``setup_data``, before any callback hook runs (fit_loop.py). So at
``on_train_start`` the callback swaps the watched loaders into the fit loop's
``CombinedLoader`` and restarts its data fetcher's iterator: a loader with
non-persistent workers starts them once more, before the first batch. Loaders rebuilt
later (``reload_dataloaders_every_n_epochs``) are watched at that epoch's start the
same way. Every other epoch Lightning's own ``iter()`` goes through the watched loaders.

Step phases (hook/phases.py) from Lightning's own hooks, in the order automatic
optimization calls them (the closure runs inside ``optimizer.step``): forward from
``on_train_batch_start`` (the batch is fetched) to ``on_before_backward``, backward from
there to ``on_before_optimizer_step`` (after the closure: gradient clipping included),
the optimizer from there to ``on_train_batch_end``.
"""
from __future__ import annotations

from typing import Any

import stallscope
from stallscope.hook import phases

try:  # the `lightning` package ships the same Trainer as lightning.pytorch
    from pytorch_lightning import Callback
except ImportError:  # pragma: no cover - only one of the two is installed
    from lightning.pytorch import Callback


def identity(trainer: Any) -> dict[str, int]:
    """The rank as Lightning knows it (its cluster environment: torchrun, SLURM, DDP)."""
    return {"rank": int(trainer.global_rank), "local_rank": int(trainer.local_rank),
            "world_size": int(trainer.world_size)}


class StallscopeCallback(Callback):
    """Watch every train dataloader of the fit; ``watch_kwargs`` go to ``stallscope.watch``
    (``job=...`` names the run; the rank comes from the Trainer)."""

    def __init__(self, **watch_kwargs: object) -> None:
        self.watch_kwargs = watch_kwargs

    def _watch_train_loaders(self, trainer: Any, restart: bool) -> None:
        loop = trainer.fit_loop
        combined = getattr(loop, "_combined_loader", None)
        fetcher = getattr(loop, "_data_fetcher", None)
        if combined is None or fetcher is None:
            return
        loaders = combined.flattened
        watched = [stallscope.watch(dl, **dict(identity(trainer), **self.watch_kwargs)) for dl in loaders]
        if all(w is dl for w, dl in zip(watched, loaders)):
            return  # watched already (watch() returns a watched loader unchanged)
        combined.flattened = watched
        if restart:
            iter(fetcher)  # the fetcher's iterator goes through the watched loaders from now on

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._watch_train_loaders(trainer, restart=True)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Only loaders rebuilt for this epoch are not watched yet; after this hook the
        # epoch loop calls iter() on the fetcher itself (training_epoch_loop.on_run_start).
        if trainer.current_epoch > 0:
            self._watch_train_loaders(trainer, restart=False)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        phases.get().begin("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        phases.get().begin("backward", after="forward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        phases.get().begin("optimizer", after="backward")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        phases.get().end_step()
