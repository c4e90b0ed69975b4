"""Finding a watched DataLoader's own iterator, however its ``__iter__`` is wrapped.

``watch()`` needs the DataLoader's iterator object (``_BaseDataLoaderIter``) for the
evidence that only it carries: the worker PIDs, the queue polls that split a wait into
waiting for a ready batch and transfer (transfer.py), and the moment its workers start
(to lend them our ``worker_init_fn``, batches.py). ``iter(loader)`` does not always hand
it over: another profiler may patch ``DataLoader.__iter__`` with a generator (TraceML's
auto mode), and framework loaders wrap the DataLoader and yield from its iterator
(accelerate's ``DataLoaderShard``, Lightning's ``CombinedLoader``). A generator does not
even create the iterator until its first ``next()``.

So the claim is made where every DataLoader iterator is made: ``DataLoader._get_iterator``,
patched once per process. While a watched iterator is being set up (``iter()`` and, when
that returned a stand-in, its first ``next()``), the claim is armed for this thread; the
first DataLoader iterator built meanwhile is the watched one's. Unarmed, the patch costs
one attribute read per epoch.
"""
from __future__ import annotations

import sys
import threading

from . import transfer

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .identity import Ident


class Claim:
    """One armed claim: who asks (the rank identity, this thread), and what was found."""

    __slots__ = ("ident", "build", "loader", "iterator", "polls")

    def __init__(self, ident: Ident, build: Callable[[Callable[[Any], Any], Any, Ident], Any]) -> None:
        self.ident = ident
        self.build = build  # (the original _get_iterator, the DataLoader, ident) -> iterator
        self.loader: Any = None     # the DataLoader whose iterator was built
        self.iterator: Any = None   # its _BaseDataLoaderIter
        self.polls: tuple[list[int], bool] | None = None  # transfer.attach's result

    def take(self, loader: Any, it: Any) -> None:
        self.loader, self.iterator = loader, it
        self.polls = transfer.attach(it)

    def adopt(self, loader: Any) -> bool:
        """Persistent workers: no new iterator is built after the first epoch; the
        DataLoader keeps its own in ``_iterator``. True when ``loader`` has one."""
        it = getattr(loader, "_iterator", None) if loader is not None else None
        if it is None or not hasattr(it, "_workers"):
            return False
        self.take(loader, it)
        return True


_local = threading.local()  # .armed: this thread's armed claim


def arm(ident: Ident, build: Callable[[Callable[[Any], Any], Any, Ident], Any]) -> Claim:
    """Claim the next DataLoader iterator this thread builds; ``build`` builds it
    (batches.py: with our worker_init_fn lent, the single-process fetcher timed). A claim
    left armed (a stand-in never advanced) gives way to the next one armed here."""
    _patch()
    claim = Claim(ident, build)
    _local.armed = claim
    return claim


def disarm(claim: Claim) -> None:
    if getattr(_local, "armed", None) is claim:
        _local.armed = None


def _patch() -> None:
    """Patch ``_get_iterator`` on DataLoader and on every subclass that defines its own:
    torchdata's ``StatefulDataLoader`` and litdata's ``StreamingDataLoader`` build their
    own iterator classes there without calling DataLoader's (issue 34). Subclasses are
    walked on each arm (once an epoch: a few classes), so one imported after the first
    epoch is patched too."""
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    cls = getattr(dataloader, "DataLoader", None)
    if cls is None:
        return
    todo: list[Any] = [cls]
    seen: set[Any] = set()
    while todo and len(seen) < _MAX_CLASSES:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        _patch_class(c)
        try:
            todo.extend(c.__subclasses__())
        except Exception:
            pass


_MAX_CLASSES = 256  # DataLoader subclasses walked; a program defining more is not one we know


def _patch_class(cls: Any) -> None:
    original = cls.__dict__.get("_get_iterator")
    if original is None or getattr(original, "_stallscope", False):
        return

    def _get_iterator(self: Any) -> Any:
        claim: Claim | None = getattr(_local, "armed", None)
        if claim is None or claim.iterator is not None:
            return original(self)
        it = claim.build(original, self, claim.ident)
        try:
            claim.take(self, it)
        except Exception:
            pass
        return it

    _get_iterator._stallscope = True  # type: ignore[attr-defined]
    cls._get_iterator = _get_iterator
