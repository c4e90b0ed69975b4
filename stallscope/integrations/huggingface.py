"""Hugging Face: ``Trainer(..., callbacks=[StallscopeCallback()])`` for transformers,
``loader = watch_prepared(accelerator.prepare(loader))`` for accelerate loops; the rank
identity comes from Accelerate's state.

accelerate's ``prepare`` returns a ``DataLoaderShard`` around a DataLoader it builds
(``base_dataloader``); its ``__iter__`` is a generator over that DataLoader's iterator.
``watch()`` of the shard times the loop's ``next()`` on the shard and finds the
DataLoader's own iterator behind the generator (hook/claim.py). The Trainer keeps its
loader in a local variable, so its callback cannot hand back a wrapper: it watches the
shard's ``base_dataloader`` in place instead (the shard iterates it once an epoch).

Step phases (hook/phases.py) from the Trainer's own events and the model's forward: the
forward from ``on_step_begin`` (the batch is fetched) to the end of the model's forward
(a forward hook the callback registers on the model at ``on_train_begin``), backward from
there to ``on_pre_optimizer_step`` (gradient clipping included), the optimizer from there
to ``on_step_end`` (the scheduler and ``zero_grad`` included). With gradient accumulation
a step's micro-batches' forwards after the first count as backward; its phases are timed
per optimizer step.
"""
from __future__ import annotations

import warnings
from typing import Any

from transformers import TrainerCallback

import stallscope
from stallscope.hook import phases


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
        model = kwargs.get("model")
        if model is not None and getattr(self, "_forward_hook", None) is None:
            self._forward_hook = model.register_forward_hook(_forward_done)
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

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        phases.get().begin("forward")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        phases.get().begin("optimizer", after="backward")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        phases.get().end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hook = getattr(self, "_forward_hook", None)
        if hook is not None:
            hook.remove()
            self._forward_hook = None


def _forward_done(module: Any, inputs: Any, output: Any) -> None:
    phases.get().begin("backward", after="forward")  # evaluation's forwards change nothing
