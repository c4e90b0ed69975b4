"""Mosaic Streaming (``mosaicml-streaming`` 0.13): a ``StreamingDataset`` copies each
shard from its remote (a URL, or another local path) into its local cache once, then
reads samples from the local copy. The copy is the storage read; a shard already in
the local cache is a cache hit. Three patches, each in the process that does the work
(a DataLoader worker and its download thread, as a rule):

- ``Stream._download_file``: one shard read per file fetched (open, transfer and rename
  of the copy; the tier follows the stream's remote: ``s3``, ``gcs``, or the mount's
  tier for a path), with the file's bytes.
- ``Stream.prepare_shard`` (called only for a shard that is not in the cache): a miss
  when it fetched anything, so each shard copied is one miss, however many workers
  asked for it at once.
- ``Reader.get_item`` (one sample from a shard's local copy): the first sample a thread
  reads from a shard it did not copy itself is a hit, one per run of samples from the
  same shard (a hit means "a shard this worker needed was there", not one per sample).
  A per-sample lookup would bury the misses: a shard holds hundreds of samples.

Not observed: the reads of samples from the local copy (``MDSReader`` opens, seeks and
reads the file per sample: page-cache reads, not storage), decompression of zipped
shards, and evictions under ``cache_limit`` (a shard evicted and needed again is a miss
and a download once more, which is what counts).
"""
from __future__ import annotations

import os
import sys
import threading
from time import perf_counter_ns

from .. import shards, tiers

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

# streaming has no type information: its modules and classes are Any here.

CACHE_TIER = "streaming-cache"
_local = threading.local()  # .fetched: files this thread copied for the shard it prepares;
# .shard: id() of the shard the previous sample came from
_copied: set[int] = set()  # id() of the shards this process copied (their reads are no hits)


def _patch_download(cls: Any, index_basename: str) -> None:
    original = cls._download_file

    def _download_file(self: Any, from_basename: str, to_basename: str | None = None) -> Any:
        start = perf_counter_ns()
        path = original(self, from_basename, to_basename)
        try:
            if self.remote and from_basename != index_basename:  # the index is metadata
                remote = os.path.join(self.remote, self.split or "", from_basename)
                shards.record_shard_read(remote, tiers.of_url(self.remote),
                                         (perf_counter_ns() - start) / 1e9, os.path.getsize(path))
                _local.fetched = getattr(_local, "fetched", 0) + 1
        except Exception:
            pass
        return path

    _download_file._stallscope = True  # type: ignore[attr-defined]
    _download_file.__wrapped__ = original  # type: ignore[attr-defined]
    cls._download_file = _download_file


def _patch_prepare(cls: Any) -> None:
    original = cls.prepare_shard

    def prepare_shard(self: Any, shard: Any) -> Any:
        _local.fetched = 0
        delta = original(self, shard)
        try:
            if _local.fetched:
                _copied.add(id(shard))
                shards.cache_lookup(CACHE_TIER, False)
        except Exception:
            pass
        return delta

    prepare_shard._stallscope = True  # type: ignore[attr-defined]
    cls.prepare_shard = prepare_shard


def _patch_reader(cls: Any) -> None:
    original = cls.get_item

    def get_item(self: Any, idx: int) -> Any:
        item = original(self, idx)  # raises FileNotFoundError while the shard is not local
        key = id(self)
        if getattr(_local, "shard", None) != key:
            _local.shard = key
            if key not in _copied:
                shards.cache_lookup(CACHE_TIER, True)
        return item

    get_item._stallscope = True  # type: ignore[attr-defined]
    cls.get_item = get_item


def install() -> None:
    stream = sys.modules["streaming.base.stream"]
    if getattr(stream.Stream._download_file, "_stallscope", False):
        return
    index_basename = "index.json"
    fmt = sys.modules.get("streaming.base.format")
    if fmt is not None and hasattr(fmt, "get_index_basename"):
        index_basename = fmt.get_index_basename()
    _patch_download(stream.Stream, index_basename)
    _patch_prepare(stream.Stream)
    reader = sys.modules.get("streaming.base.format.base.reader")
    if reader is not None:
        _patch_reader(reader.Reader)
