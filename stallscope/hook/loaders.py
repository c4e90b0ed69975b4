"""What the hook can tell of a watched loader that is not a torch DataLoader.

A ``torch.utils.data.DataLoader`` (and its subclasses: torchdata's ``StatefulDataLoader``,
litdata's ``StreamingDataLoader``) is introspected in watch.py and claim.py: settings,
worker PIDs, the workers' batch load times and the ready/transfer split. Other loaders
keep their work where the hook cannot reach it (threads of a ``torchdata.nodes`` graph,
Ray Data's tasks in other processes), so only the per-batch data-wait is measured. This
module reads what settings such a loader exposes (``torchdata.nodes``: the workers of its
``ParallelMapper``, the ``Batcher``'s size, a ``Prefetcher``, a ``PinMemory`` node) and
says once per loader type what is not introspected (issue 34).

Standard library only, duck-typed through ``sys.modules``: nothing here imports a loader
package, and nothing raises.
"""
from __future__ import annotations

import sys
import warnings

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

MAX_NODES = 64  # a nodes graph walked from its root through .source; deeper is not ours

_BUILTIN_MODULES = ("builtins", "itertools", "collections")


def nodes_info(loader: object) -> dict[str, object] | None:
    """The settings of a ``torchdata.nodes.Loader``'s graph, or None for anything else.

    ``num_workers`` is the first ``ParallelMapper``'s from the root (the map nearest the
    loop, where per-sample work is parallel); its workers are threads or processes the
    hook does not see, so ``worker_pids`` stays empty."""
    nodes = sys.modules.get("torchdata.nodes")
    loader_cls = getattr(nodes, "Loader", None)
    if loader_cls is None or not isinstance(loader, loader_cls):
        return None
    try:
        mapper = getattr(nodes, "ParallelMapper", None)
        batcher = getattr(nodes, "Batcher", None)
        prefetcher = getattr(nodes, "Prefetcher", None)
        pin = getattr(nodes, "PinMemory", None)
        info: dict[str, object] = {"num_workers": None, "prefetch_factor": None, "pin_memory": False,
                                   "persistent_workers": None, "batch_size": None, "worker_pids": []}
        node: Any = getattr(loader, "root", None)
        for _ in range(MAX_NODES):
            if node is None:
                break
            if mapper is not None and isinstance(node, mapper) and info["num_workers"] is None:
                info["num_workers"] = _int(getattr(node, "num_workers", None))
            elif batcher is not None and isinstance(node, batcher) and info["batch_size"] is None:
                info["batch_size"] = _int(getattr(node, "batch_size", None))
            elif prefetcher is not None and isinstance(node, prefetcher) and info["prefetch_factor"] is None:
                info["prefetch_factor"] = _int(getattr(node, "prefetch_factor", None))
            elif pin is not None and isinstance(node, pin):
                info["pin_memory"] = True
            node = getattr(node, "source", None)
        return info
    except Exception:
        return None


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
    got = "the per-batch data-wait"
    if info:
        named = ", ".join("%s=%s" % (k, info[k]) for k in ("num_workers", "batch_size")
                          if info.get(k) is not None)
        if named:
            got += " and its settings (%s)" % named
    warnings.warn(
        "stallscope.watch: %s.%s is not a torch DataLoader: measured: %s; not introspected: "
        "worker PIDs, the workers' batch load times and the ready/transfer split of each wait "
        "(docs/integrations.md)" % (kind.__module__, kind.__qualname__, got),
        RuntimeWarning, stacklevel=4)
