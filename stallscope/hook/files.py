"""Timed file objects and the plain-files adapter (``stallscope.DatasetRoot``).

One shard read is the time to open a shard plus the time spent inside its read calls,
with the bytes those calls returned. Decode work done between reads (a tar stream
read lazily while samples are decoded) is not storage latency and is not counted.
The read is reported once, when the file is closed or, if nobody closes it (WebDataset
drops its streams), when the file object goes away.

    root = stallscope.DatasetRoot("/mnt/data/train")     # tier from the mount: fuse, nfs ...
    data = root.read("00042.jpg")                          # one timed read
    with root.open("shard-0001.tar") as f: ...             # timed open + reads
"""
from __future__ import annotations

import os
from time import perf_counter_ns

from . import shards, tiers

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any, Literal


class TimedFile:
    """A transparent proxy for a readable file (``isinstance`` sees the real class)."""

    __slots__ = ("_ss_f", "_ss_shard", "_ss_tier", "_ss_ns", "_ss_bytes", "_ss_done")

    def __init__(self, f: Any, shard: object, tier: str, open_ns: int = 0) -> None:
        self._ss_f = f
        self._ss_shard = shard
        self._ss_tier = tier
        self._ss_ns = open_ns
        self._ss_bytes = 0
        self._ss_done = False

    @property  # type: ignore[misc]  # read-only: a proxy cannot be re-classed
    def __class__(self) -> type:
        return type(self._ss_f)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_ss_"):
            raise AttributeError(name)
        return getattr(self._ss_f, name)

    def _timed(self, method: Callable[[Any], Any], arg: Any) -> Any:
        start = perf_counter_ns()
        data = method(arg)
        self._ss_ns += perf_counter_ns() - start
        return data

    def read(self, size: int | None = -1) -> Any:
        data = self._timed(self._ss_f.read, size)
        self._ss_bytes += len(data or b"")
        return data

    def read1(self, size: int = -1) -> Any:
        data = self._timed(self._ss_f.read1, size)
        self._ss_bytes += len(data or b"")
        return data

    def readline(self, size: int | None = -1) -> Any:
        data = self._timed(self._ss_f.readline, size)
        self._ss_bytes += len(data or b"")
        return data

    def readinto(self, buf: Any) -> Any:
        n = self._timed(self._ss_f.readinto, buf)
        self._ss_bytes += n or 0
        return n

    def readinto1(self, buf: Any) -> Any:
        n = self._timed(self._ss_f.readinto1, buf)
        self._ss_bytes += n or 0
        return n

    def __iter__(self) -> TimedFile:
        return self

    def __next__(self) -> Any:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __enter__(self) -> TimedFile:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def _report(self) -> None:
        if not self._ss_done:
            self._ss_done = True
            shards.record_shard_read(self._ss_shard, self._ss_tier, self._ss_ns / 1e9, self._ss_bytes)

    def close(self) -> Any:
        self._report()
        return self._ss_f.close()

    def __del__(self) -> None:
        try:
            self._report()
        except Exception:
            pass


def open_timed(path: str | os.PathLike[str], mode: str = "rb", tier: str | None = None,
               **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` whose open and reads are reported as one shard read."""
    start = perf_counter_ns()
    f = open(path, mode, **kwargs)
    if "r" not in mode or "+" in mode:
        return f
    try:
        tier = tiers.bounded(tier or tiers.of_path(path))
    except Exception:
        tier = tiers.OTHER
    # A proxy that passes for f (isinstance included): typed as the file it stands for.
    return TimedFile(f, path, tier, perf_counter_ns() - start)  # type: ignore[return-value]


class DatasetRoot:
    """Files under a dataset root, opened and read with timing. Picklable (it is only a
    path and a tier), so a Dataset holding one works with every worker start method."""

    def __init__(self, root: str | os.PathLike[str], tier: str | None = None) -> None:
        self.root = os.fspath(root)
        self.tier = tier  # None: the root's mount decides (local, fuse, nfs, memory ...)

    def _tier(self) -> str:
        if self.tier is None:
            try:
                self.tier = tiers.of_path(os.path.join(self.root, "x"))
            except Exception:
                self.tier = tiers.OTHER
        return self.tier

    def path(self, name: str | os.PathLike[str]) -> str:
        return os.path.join(self.root, os.fspath(name))

    def open(self, name: str | os.PathLike[str], mode: str = "rb", **kwargs: Any) -> IO[Any]:
        return open_timed(self.path(name), mode, self._tier(), **kwargs)

    def read(self, name: str | os.PathLike[str]) -> bytes:
        """The whole file's bytes, as one timed shard read."""
        path = self.path(name)
        with shards.shard_read(path, self._tier()) as r:
            with open(path, "rb") as f:
                data = f.read()
            r.bytes = len(data)
        return data

    def __repr__(self) -> str:
        return "DatasetRoot(%r, tier=%r)" % (self.root, self.tier)
