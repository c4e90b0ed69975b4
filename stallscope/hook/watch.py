"""``stallscope.watch(loader)``: a transparent wrapper that times every ``next()``.

The wrapper behaves like the wrapped iterable: same items in the same order, ``len()``
where the original has one, re-iterable per epoch, attribute reads and writes passed
through (``set_epoch``, ``dataset``, ``sampler`` ...), and ``isinstance(w, DataLoader)``
still true (``__class__`` is forwarded, as wrapt's ObjectProxy does). Instrumentation is
idempotent (watching a watched loader returns it) and reversible (``unwatch``).

The per-batch path is loop.py's; all other work happens on the channel's flush thread
(channel.py).
"""
from __future__ import annotations

import os
import sys
import warnings

from . import batches, channel, claim, device, identity, loaders, passthrough
from .loop import Loop, WatchedIterator, watched_iterator

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeVar

    from .identity import Ident

    _IterableT = TypeVar("_IterableT", bound=Iterable[Any])

_OVERRIDES = set(identity.FIELDS)
_LOADER_FIELDS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "batch_size")


class _Watched:
    """Proxy for a watched iterable. Only ``_ss_*`` slots live on the proxy itself."""

    # Set with object.__setattr__: the proxy's own __setattr__ writes to the wrapped object.
    # Not annotated in the class body, which would give the proxy an __annotations__ of its
    # own instead of the wrapped one's; mypy types them through __getattr__ (Any).
    __slots__ = ("_ss_wrapped", "_ss_ident", "_ss_iter", "_ss_dl", "__weakref__", "__dict__")

    def __init__(self, wrapped: Iterable[Any], ident: Ident) -> None:
        object.__setattr__(self, "_ss_wrapped", wrapped)
        shared = passthrough.instance_dict(wrapped)
        if shared is not None:
            # The wrapped object's own attributes found in C, as on the object itself:
            # through __getattr__ each read cost ~0.8 us, and frameworks read them per
            # batch (issue 19). Writes still go to the wrapped object (__setattr__).
            object.__setattr__(self, "__dict__", shared)
        object.__setattr__(self, "_ss_ident", ident)
        object.__setattr__(self, "_ss_iter", None)
        object.__setattr__(self, "_ss_dl", None)  # the DataLoader found behind it (claim.py)

    @property  # type: ignore[misc]  # read-only: a proxy cannot be re-classed
    def __class__(self) -> type:
        return type(self._ss_wrapped)

    def __getattr__(self, name: str) -> Any:
        # Only what the shared instance dict lacks comes here: the class's attributes and
        # misses, with the wrapped object's own error (a DataLoader's proxy has none of
        # this: its class answers, passthrough.py).
        if name.startswith("_ss_"):
            raise AttributeError(name)
        return getattr(self._ss_wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._ss_wrapped, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._ss_wrapped, name)

    def __repr__(self) -> str:
        return repr(self._ss_wrapped)

    def __iter__(self) -> WatchedIterator:
        it, armed = batches.iterate(self._ss_wrapped, self._ss_ident)  # + batch production timing
        ch = channel.get()
        wrapper, loop = watched_iterator(it, self._ss_ident)
        stream = wrapper._stream
        stream.cuda = device.cuda_device()
        if armed is not None and armed.iterator is None:
            # iter() handed back a stand-in (a generator, an adapter): the DataLoader's
            # iterator is built on the first next(), which settles the claim (claim.py)
            loop.next, loop.first = _first_next(self, loop, armed, it), True
        else:
            _settle(self, loop, armed, it)
        ch.add_stream(stream)
        return wrapper


def _settle(proxy: _Watched, loop: Loop, armed: claim.Claim | None, it: Any) -> None:
    """The evidence from the DataLoader's own iterator: settings, worker PIDs, polls."""
    stream = loop.stream
    assert stream is not None
    try:
        loader, inner, polls = proxy._ss_wrapped, it, None
        if armed is not None and armed.iterator is not None:
            loader, inner, polls = armed.loader, armed.iterator, armed.polls
            object.__setattr__(proxy, "_ss_dl", loader)  # for later epochs (persistent)
            loop.inner = inner  # its workers' exit codes, should the loader raise
        stream.loader = loader_info(loader, inner)
        if polls is not None:
            stream.split(*polls)
        if not _is_dataloader(loader):
            loaders.say_bare(loader, stream.loader)  # once per loader type (loaders.py)
    except Exception:
        stream.loader = None


def _first_next(proxy: _Watched, loop: Loop,
                armed: claim.Claim, it: Any) -> Callable[[], Any]:
    def first() -> Any:
        try:
            return it.__next__()
        finally:
            claim.disarm(armed)
            loop.next = it.__next__  # every later batch: the plain path
            try:
                if armed.iterator is None:
                    armed.adopt(proxy._ss_dl) or armed.adopt(proxy._ss_wrapped)
                if armed.iterator is None and _is_dataloader(proxy._ss_wrapped):
                    _say_lost(it)
                _settle(proxy, loop, armed, it)
            except Exception:
                pass
    return first


_lost_said = False


def _say_lost(it: object) -> None:
    """Once per process: which evidence a hidden DataLoader iterator costs, and why."""
    global _lost_said
    if _lost_said:
        return
    _lost_said = True
    kind = type(it)
    warnings.warn(
        "stallscope.watch: the DataLoader's iterator is hidden behind %s.%s (another tool "
        "wraps DataLoader.__iter__ and builds its iterator elsewhere): lost for this loader: "
        "worker batch times, worker PIDs and the ready/transfer split of each wait; the "
        "per-batch data-wait is still measured" % (kind.__module__, kind.__qualname__),
        RuntimeWarning, stacklevel=3)


class _WatchedSized(_Watched):
    __slots__ = ()

    def __len__(self) -> int:
        return len(self._ss_wrapped)


def _next_of_iterator(self: _Watched) -> Any:
    # For watched iterators (generators): keep one wrapped iterator across next() calls.
    it = self._ss_iter
    if it is None:
        it = _Watched.__iter__(self)
        object.__setattr__(self, "_ss_iter", it)
    return next(it)


_WatchedIter = type("_WatchedIter", (_Watched,), {"__slots__": (), "__next__": _next_of_iterator})
_WatchedSizedIter = type("_WatchedSizedIter", (_WatchedSized,),
                         {"__slots__": (), "__next__": _next_of_iterator})
_PROXY_TYPES = (_Watched, _WatchedSized, _WatchedIter, _WatchedSizedIter)


def _is_watched(obj: object) -> bool:
    return type(obj) in _PROXY_TYPES or type(obj) in passthrough.SUBCLASSES


def _is_dataloader(obj: object) -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and isinstance(obj, data.DataLoader)


def loader_info(loader: object, it: object = None) -> dict[str, object] | None:
    """DataLoader settings and this epoch's worker PIDs; a ``torchdata.nodes`` graph's
    settings (loaders.py); None for other iterables."""
    if not _is_dataloader(loader):
        return loaders.nodes_info(loader)
    info: dict[str, object] = {}
    for field in _LOADER_FIELDS:
        value = getattr(loader, field, None)
        info[field] = value if isinstance(value, (bool, int, type(None))) else str(value)
    if info.get("batch_size") is None:
        # a loader built with a batch_sampler (the Hugging Face Trainer's, accelerate's)
        # has batch_size None: the sampler's is the one it batches by (issue 52)
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            info["batch_size"] = size
    workers = getattr(it, "_workers", None) or []
    info["worker_pids"] = [w.pid for w in workers if getattr(w, "pid", None)]
    shards = _dataset_shards(getattr(loader, "dataset", None))
    if shards is not None:
        info["dataset_shards"] = shards
    return info


def _dataset_shards(dataset: object) -> int | None:
    """The shards of an iterable dataset that splits them among workers (Hugging Face
    ``datasets``' ``IterableDataset``, a torch ``IterableDataset``: ``num_shards``, earlier
    ``n_shards``; N shards feed at most N workers, the rest are stopped with a warning),
    or None. Read once an iterator, never raising."""
    data = sys.modules.get("torch.utils.data")
    iterable = getattr(data, "IterableDataset", None)
    if iterable is None or not isinstance(dataset, iterable):
        return None
    for name in ("num_shards", "n_shards"):
        try:
            n = getattr(dataset, name, None)
        except Exception:  # a property of someone else's class: anything may come out of it
            continue
        if type(n) is int and n > 0:
            return n
    return None


def watch(iterable: _IterableT, **overrides: object) -> _IterableT:
    """Wrap ``iterable`` so every rank reports how long it waited for each batch.

    Keyword overrides: job, rank, local_rank, world_size, pod, namespace, node.
    Set STALLSCOPE_DISABLE=1 to get the iterable back untouched.
    """
    if _is_watched(iterable) or os.environ.get("STALLSCOPE_DISABLE") == "1":
        return iterable
    unknown = set(overrides) - _OVERRIDES
    if unknown:
        # A typo must not kill a training job: warn and carry on.
        warnings.warn("stallscope.watch: ignoring unknown keywords %s" % sorted(unknown), stacklevel=2)
    ident = identity.detect(None, **{k: v for k, v in overrides.items() if k in _OVERRIDES})
    if _is_dataloader(iterable) and passthrough.instance_dict(iterable) is not None:
        sub = passthrough.subclass(type(iterable), _Watched)
        if sub is not None:  # the loader's own class answers attribute reads (passthrough.py)
            watched: _IterableT = object.__new__(sub)
            _Watched.__init__(watched, iterable, ident)  # type: ignore[arg-type]
            return watched
    sized = hasattr(type(iterable), "__len__")
    is_iter = hasattr(type(iterable), "__next__")
    cls = {(False, False): _Watched, (True, False): _WatchedSized,
           (False, True): _WatchedIter, (True, True): _WatchedSizedIter}[(sized, is_iter)]
    # The proxy passes for the iterable (its __class__, attributes, len and iteration), so
    # it is typed as the iterable: a watched DataLoader is still a DataLoader to its caller.
    watched = cls(iterable, ident)
    return watched


def unwatch(iterable: _IterableT) -> _IterableT:
    """Return the original iterable of a watched one (anything else unchanged)."""
    if _is_watched(iterable):
        wrapped: _IterableT = object.__getattribute__(iterable, "_ss_wrapped")
        return wrapped
    return iterable
