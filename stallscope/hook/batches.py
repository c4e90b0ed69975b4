"""Batch production time (T_l), measured where batches are made.

A DataLoader batch is made by its fetcher: ``fetcher.fetch(indices)`` reads the samples
(map-style: ``dataset[i]`` for each index; iterable: ``next()`` batch-size times) and
collates them. We time exactly that call:

- num_workers > 0: ``watch()`` lends the loader a picklable ``worker_init_fn``
  (``WorkerInit``) for the moment the iterator starts its workers, then puts the user's
  back. In each worker (fork, forkserver or spawn alike: the rank identity and the
  socket path travel inside the pickled init) it runs the user's init after ours, and
  ours wraps ``_DatasetKind.create_fetcher`` *in that worker process only*, which the
  worker loop calls right after the init and again on each epoch of persistent
  workers (torch/utils/data/_utils/worker.py).
- num_workers == 0: the single-process iterator's ``_dataset_fetcher`` is wrapped in
  the trainer; this is the only case where the loop itself pays (two clock reads).

What the loader yields and its order are untouched: the wrapper returns the fetcher's
result as is, and a fetch that raises (StopIteration at the end of an iterable
dataset, or a dataset error) is not counted and re-raised unchanged.

Each worker reports through its own channel as ``role="worker"``, using the Stream
format: one event ``[t_end_ns, load_ns, interval_ns]`` per batch, where load is the
fetch time and interval the time since the worker's previous batch ended (so the
worker's idle time is interval - load). The message's ``pid`` is the worker's own PID;
the agent gets its host PID from SO_PEERCRED, which finds workers that are not the
trainer's children (forkserver, spawn).
"""
from __future__ import annotations

import sys
import weakref
from time import perf_counter_ns

from . import adapters, channel, claim, loaders, process

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .identity import Ident


class _TimedFetcher:
    __slots__ = ("_fetcher", "_buf", "__weakref__")

    def __init__(self, fetcher: Any, buf: list[int]) -> None:
        self._fetcher = fetcher  # torch's _BaseDatasetFetcher (untyped internals)
        self._buf = buf

    def fetch(self, possibly_batched_index: Any, _now: Callable[[], int] = perf_counter_ns) -> Any:
        buf = self._buf
        buf.append(_now())
        try:
            data = self._fetcher.fetch(possibly_batched_index)
        except BaseException:
            # Not a batch (end of data, or an error the loader re-raises): drop the start.
            # The flush thread only takes even counts, so the lone start is still last.
            buf.pop()
            raise
        buf.append(_now())
        return data

    def __getattr__(self, name: str) -> Any:
        if name in _TimedFetcher.__slots__:
            raise AttributeError(name)
        return getattr(self._fetcher, name)


def timed(fetcher: Any) -> _TimedFetcher:
    """``fetcher`` wrapped, reporting to this process's channel as a worker stream."""
    stream = channel.Stream(process.get_ident(), role="worker")
    wrapper = _TimedFetcher(fetcher, stream.buf)
    stream.owner = weakref.ref(wrapper)  # the stream ends (flushes, goes) with the fetcher
    channel.get().add_stream(stream)
    return wrapper


def _patch_create_fetcher() -> None:
    kind = sys.modules["torch.utils.data.dataloader"]._DatasetKind
    original = kind.__dict__["create_fetcher"].__func__
    if getattr(original, "_stallscope", False):
        return

    def create_fetcher(*args: Any, **kwargs: Any) -> Any:
        fetcher = original(*args, **kwargs)
        try:
            return timed(fetcher)
        except Exception:
            return fetcher

    create_fetcher._stallscope = True  # type: ignore[attr-defined]
    kind.create_fetcher = staticmethod(create_fetcher)


def start_worker(ident: Ident, socket_path: str | None) -> None:
    """Runs first in each DataLoader worker; never raises."""
    try:
        process.ident, process.role = ident, "worker"
        ch = channel.get()
        if socket_path and ch.sock is None:
            ch.path = socket_path
        ch.connect_now()  # the agent learns of the worker's death from the hang-up
        _patch_create_fetcher()
        adapters.enable()
        process.flush_at_exit()
    except Exception:
        pass


class WorkerInit:
    """The ``worker_init_fn`` lent to a watched DataLoader: ours, then the user's."""

    def __init__(self, user_fn: Callable[[int], object] | None, ident: Ident,
                 socket_path: str | None) -> None:
        self.user_fn = user_fn
        self.ident = ident
        self.socket_path = socket_path

    def __call__(self, worker_id: int) -> object:
        start_worker(self.ident, self.socket_path)
        if self.user_fn is not None:
            return self.user_fn(worker_id)
        return None


def time_single_process(it: Any) -> None:
    """num_workers == 0: time the single-process iterator's fetcher in this process."""
    try:
        fetcher = getattr(it, "_dataset_fetcher", None)
        if fetcher is not None and not isinstance(fetcher, _TimedFetcher):
            it._dataset_fetcher = timed(fetcher)
    except Exception:
        pass


def is_loader_iterator(it: object) -> bool:
    """A DataLoader's own iterator (single- or multi-process), as claim.py takes it."""
    return hasattr(it, "_dataset_fetcher") or hasattr(it, "_worker_result_queue")


def build_iterator(original: Callable[[Any], Any], loader: Any, ident: Ident) -> Any:
    """``original(loader)`` (DataLoader._get_iterator, claim.py) with our worker_init_fn
    lent for the moment the workers start, and the single-process fetcher timed."""
    user_fn, lent = None, False
    try:
        if (loader.num_workers or 0) > 0:
            user_fn = loader.worker_init_fn
            if not isinstance(user_fn, WorkerInit):
                loader.worker_init_fn = WorkerInit(user_fn, ident, channel.get().path)
                lent = True
    except Exception:
        pass
    try:
        it = original(loader)
    finally:
        if lent:
            try:
                loader.worker_init_fn = user_fn
            except Exception:
                pass
    time_single_process(it)
    return it


def iterate(loader: Any, ident: Ident) -> tuple[Any, claim.Claim | None]:
    """``iter(loader)`` with a claim armed on the DataLoader iterator built meanwhile
    (claim.py: worker timing, PIDs, polls). The claim comes back still armed when
    ``iter()`` returned a stand-in that builds it on its first ``next()``; the caller
    settles it then. None when the claim could not be made (no torch loaded)."""
    armed = None
    try:
        if process.role == "main":
            process.ident = ident  # shard reads in this process report as this rank
        adapters.enable()
        loaders.time_mappers(loader)  # a torchdata.nodes graph's mapper threads
        if "torch.utils.data.dataloader" in sys.modules:
            armed = claim.arm(ident, build_iterator)
    except Exception:
        armed = None
    try:
        it = iter(loader)
    except BaseException:
        if armed is not None:
            claim.disarm(armed)
        raise
    if armed is not None and armed.iterator is None and is_loader_iterator(it):
        # persistent workers: the DataLoader handed back the iterator it keeps
        try:
            armed.take(loader, it)
        except Exception:
            pass
    if armed is not None and armed.iterator is not None:
        claim.disarm(armed)
    return it, armed
