"""What the hook can tell of a watched loader that is not a torch DataLoader.

A ``torch.utils.data.DataLoader`` (and its subclasses: torchdata's ``StatefulDataLoader``,
litdata's ``StreamingDataLoader``) is introspected in watch.py and claim.py: settings,
worker PIDs, the workers' batch load times and the ready/transfer split. Other loaders
keep their work where the hook cannot reach it (threads of a ``torchdata.nodes`` graph,
Ray Data's tasks in other processes), so only the per-batch data-wait is measured. This
module reads what settings such a loader exposes (``torchdata.nodes``: the workers of its
``ParallelMapper``, the ``Batcher``'s size, a ``Prefetcher``, a ``PinMemory`` node),
times the map function of a ``ParallelMapper`` whose workers are threads of this process
(``time_mappers``: each thread reports as a loader worker would, the time it spent making
one batch's worth of items) and says once per loader type what is not introspected
(issue 34).

Standard library only, duck-typed through ``sys.modules``: nothing here imports a loader
package, and nothing raises.
"""
from __future__ import annotations

import sys
import threading
import warnings
import weakref
from time import perf_counter_ns

from . import channel, process

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

MAX_NODES = 64  # a nodes graph walked from its root through .source; deeper is not ours

_BUILTIN_MODULES = ("builtins", "itertools", "collections")


def _graph(loader: object) -> Iterator[object]:
    """The nodes of a ``torchdata.nodes.Loader``'s graph from its root down through
    ``.source``; nothing for anything else."""
    nodes = sys.modules.get("torchdata.nodes")
    loader_cls = getattr(nodes, "Loader", None)
    if loader_cls is None or not isinstance(loader, loader_cls):
        return
    node = getattr(loader, "root", None)
    for _ in range(MAX_NODES):
        if node is None:
            return
        yield node
        node = getattr(node, "source", None)


def nodes_info(loader: object) -> dict[str, object] | None:
    """The settings of a ``torchdata.nodes.Loader``'s graph, or None for anything else.

    ``num_workers`` is the first ``ParallelMapper``'s from the root (the map nearest the
    loop, where per-sample work is parallel); its workers are threads or processes the
    hook does not see, so ``worker_pids`` stays empty."""
    try:
        graph = list(_graph(loader))
        if not graph:
            return None
        nodes = sys.modules.get("torchdata.nodes")
        mapper = getattr(nodes, "ParallelMapper", None)
        batcher = getattr(nodes, "Batcher", None)
        prefetcher = getattr(nodes, "Prefetcher", None)
        pin = getattr(nodes, "PinMemory", None)
        info: dict[str, object] = {"num_workers": None, "prefetch_factor": None, "pin_memory": False,
                                   "persistent_workers": None, "batch_size": None, "worker_pids": []}
        node: Any
        for node in graph:
            if mapper is not None and isinstance(node, mapper) and info["num_workers"] is None:
                info["num_workers"] = _int(getattr(node, "num_workers", None))
            elif batcher is not None and isinstance(node, batcher) and info["batch_size"] is None:
                info["batch_size"] = _int(getattr(node, "batch_size", None))
            elif prefetcher is not None and isinstance(node, prefetcher) and info["prefetch_factor"] is None:
                info["prefetch_factor"] = _int(getattr(node, "prefetch_factor", None))
            elif pin is not None and isinstance(node, pin):
                info["pin_memory"] = True
        return info
    except Exception:
        return None


class _Thread(threading.local):
    """One mapper thread's batch in the making; its stream ends with the thread (the
    thread's locals go with it, and the stream's owner with them)."""

    def __init__(self) -> None:
        self.load_ns = 0
        self.items = 0
        self.stream: channel.Stream | None = None
        self.owner: _Owner | None = None


class _Owner:
    __slots__ = ("__weakref__",)


class _TimedMap:
    """A ``ParallelMapper``'s map function, timed in whichever thread calls it.

    Every ``items`` calls a thread has made (one batch's worth: the ``Batcher``'s size
    above a per-item map, 1 for a map over batches) it reports one batch made, of the
    time those calls took, through a worker stream of its own: as a DataLoader worker
    reports (batches.py), so the agent sizes the mapper's threads as it sizes workers.
    A call that raises is not counted and its error is the caller's, unchanged."""

    __slots__ = ("fn", "items", "local", "ident")

    def __init__(self, fn: Callable[[Any], Any], items: int) -> None:
        self.fn, self.items, self.local = fn, max(1, items), _Thread()
        self.ident = process.get_ident()

    def __call__(self, item: Any) -> Any:
        start = perf_counter_ns()
        out = self.fn(item)
        end = perf_counter_ns()
        try:
            t = self.local
            t.load_ns += end - start
            t.items += 1
            if t.items >= self.items:
                stream = t.stream
                if stream is None or stream.finished():
                    t.owner = _Owner()
                    stream = t.stream = channel.Stream(self.ident, role="worker")
                    stream.owner = weakref.ref(t.owner)
                    channel.get().add_stream(stream)
                # one (start, end) pair whose span is the batch's load time, ending now
                stream.buf.extend((end - t.load_ns, end))
                t.load_ns = t.items = 0
        except Exception:
            pass
        return out


def time_mappers(loader: object) -> None:
    """Time the map function of each ``ParallelMapper`` of a ``torchdata.nodes`` graph
    whose workers are threads of this process (or inline, num_workers=0). Done before
    ``iter(loader)``, which resets the graph and hands the mapper's map function to the
    threads it starts. Processes (``method="process"``) are left alone: the function is
    pickled to them. Never raises."""
    try:
        nodes = sys.modules.get("torchdata.nodes")
        mapper, batcher = getattr(nodes, "ParallelMapper", None), getattr(nodes, "Batcher", None)
        if mapper is None:
            return
        batch = 1
        for node in _graph(loader):
            if batcher is not None and isinstance(node, batcher) and batch == 1:
                batch = _int(getattr(node, "batch_size", None)) or 1
            if not isinstance(node, mapper):
                continue
            # the mapper's map runs in the implementation node it built (torchdata 0.10+:
            # ._it, under an Unbatcher when it pre-batches)
            impl: Any = getattr(node, "_it", None)
            if impl is not None and not hasattr(impl, "map_fn"):
                impl = getattr(impl, "source", None)
            fn = getattr(impl, "map_fn", None)
            if fn is None or isinstance(fn, _TimedMap) or getattr(impl, "method", None) != "thread" \
                    and getattr(impl, "num_workers", None) != 0:
                continue
            prebatch = _int(getattr(node, "prebatch", None))
            impl.map_fn = _TimedMap(fn, batch // prebatch if prebatch else batch)
    except Exception:
        pass


def _timed(loader: object) -> bool:
    """Whether a mapper of ``loader``'s graph is timed (``time_mappers``)."""
    for node in _graph(loader):
        impl = getattr(node, "_it", None)
        for it in (impl, getattr(impl, "source", None)):
            if isinstance(getattr(it, "map_fn", None), _TimedMap):
                return True
    return False


def _int(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


_said: set[type] = set()


def say_bare(loader: object, info: dict[str, object] | None) -> None:
    """Once per loader type: a loader that is not a DataLoader is measured by its
    data-wait alone (and the settings ``info`` holds). Plain containers, ranges and
    generators say nothing: they have nothing more to tell."""
    kind = type(loader)
    if kind in _said or kind.__module__ in _BUILTIN_MODULES:
        return
    _said.add(kind)
    got, missed = "the per-batch data-wait", "worker PIDs, the workers' batch load times"
    if info:
        named = ", ".join("%s=%s" % (k, info[k]) for k in ("num_workers", "batch_size")
                          if info.get(k) is not None)
        if named:
            got += ", its settings (%s)" % named
        if _timed(loader):
            got += ", its mapper threads' batch load times"
            missed = "worker PIDs (threads)"
    warnings.warn(
        "stallscope.watch: %s.%s is not a torch DataLoader: measured: %s; not introspected: "
        "%s and the ready/transfer split of each wait (docs/integrations.md)"
        % (kind.__module__, kind.__qualname__, got, missed),
        RuntimeWarning, stacklevel=4)
