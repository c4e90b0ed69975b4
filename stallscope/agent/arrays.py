"""Numpy copies of the agent's timelines, extended by the new points only.

The agent keeps events and samples as tuples in deques (cheap to append from the ingest
and exporter threads); turning an hour of 10 Hz points into arrays costs ~5 ms per
series, more than the analysis itself. Each scheduled run sees the same windows plus a
few new points, so the arrays of the last run are kept and only the tail is converted.

A window is a contiguous run of its deque (appended on the right, dropped on the left),
so the cached array's last row is found in the new list by scanning back from its end;
anything else (a longer window than cached, a reordered list) falls back to converting
everything.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, Set, Tuple

import numpy as np

Convert = Callable[[Sequence[Any]], Any]


class ArrayCache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: Dict[Hashable, Tuple[Any, Any, Any]] = {}  # key -> (first, last, array)
        self.used: Set[Hashable] = set()
        self.hits = self.misses = 0

    def array(self, key: Hashable, items: Sequence[Any], convert: Convert) -> Any:
        """``convert(items)`` for the list ``items``, reusing the last call's result."""
        with self.lock:
            self.used.add(key)
            entry = self.entries.get(key)
            arr = self._extend(entry, items, convert) if entry and items else None
            if arr is None:
                self.misses += 1
                arr = convert(items)
            else:
                self.hits += 1
            if items:
                self.entries[key] = (tuple(items[0]), tuple(items[-1]), arr)
            else:
                self.entries.pop(key, None)
            return arr

    @staticmethod
    def _extend(entry: Tuple[Any, Any, Any], items: Sequence[Any], convert: Convert) -> Optional[Any]:
        first, last, arr = entry
        n = len(items)
        for j in range(n - 1, -1, -1):  # from the end: new items are usually a few
            if tuple(items[j]) == last:
                break
        else:
            return None
        if j + 1 < n:
            arr = np.concatenate((arr, convert(items[j + 1:])))
        if len(arr) < n:
            return None  # the window reaches further back than the cached one
        arr = arr[len(arr) - n:]
        if len(arr) and tuple(items[0]) != tuple(_row(arr[0])):
            return None
        return arr

    def prune(self) -> None:
        """Forget series not asked for since the last prune (ranks gone, signals gone)."""
        with self.lock:
            for key in [k for k in self.entries if k not in self.used]:
                del self.entries[key]
            self.used = set()


def _row(row: Any) -> Any:
    return row.tolist() if hasattr(row, "tolist") else row
