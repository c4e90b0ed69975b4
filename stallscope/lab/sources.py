"""Where a lab rank's samples come from, read inside its DataLoader workers.

- ``FileSource``: shard files in a directory (local disk, or a FUSE mount with injected
  latency); optionally read with O_DIRECT, so every read goes to the disk as a cold
  dataset's would (a dataset far larger than the page cache).
- ``CachedSource``: a local cache directory in front of a slow tier (an HTTP object
  store with injected latency, objstore.py, or a directory such as a FUSE mount); a
  miss reads the slow tier. Without a cache directory, every read goes to the slow tier
  (no cache lookups).

Reads are reported with ``stallscope.shard_read`` (its tier named, or following the
path's mount: local, fuse ...) and lookups with ``stallscope.cache_lookup``; both are
standard-library only, so this module is safe in loader workers. A ``FileSource`` with
``timed`` false reads with plain ``open()``/``pread()`` and reports nothing: a trainer
with only the two public lines (issue 30), whose reads the agent sees only from outside.
A ``CachedSource`` with ``timed`` false does the same for its lookups, reads and GETs
(the lab's sampler, lab/sampler.py: runs that resemble a user's).
"""
import mmap
import os
import time
import urllib.error
import urllib.request

import stallscope

SHARD_PATTERN = "shard-%04d.bin"
RETRIES = 5
RETRY_BASE_S = 0.05  # botocore's standard mode: up to base x 2^attempt, here without jitter


def _timed(shard, tier=None):
    return stallscope.shard_read(shard, tier=tier)


class _Untimed:
    """What ``_timed`` gives a read nobody reports: the same ``with`` and ``.bytes``."""
    bytes = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _unreported(tier, status, retry):
    pass


def _cache_lookup(tier, hit):
    stallscope.cache_lookup(tier, hit)


def shard_name(index):
    return SHARD_PATTERN % index


def make_shards(directory, count, size):
    """Write ``count`` shard files of ``size`` bytes (idempotent)."""
    os.makedirs(directory, exist_ok=True)
    block = os.urandom(min(size, 1 << 16))
    for i in range(count):
        path = os.path.join(directory, shard_name(i))
        if os.path.exists(path) and os.path.getsize(path) == size:
            continue
        with open(path, "wb") as f:
            left = size
            while left > 0:
                left -= f.write(block[:left])
    return directory


class FileSource:
    def __init__(self, directory, shards, read_bytes, shard_bytes, direct=False,
                 retries=2, retry_s=0.1, pattern=SHARD_PATTERN, timed=True):
        self.directory = directory
        self.shards = shards
        self.read_bytes = read_bytes
        self.shard_bytes = shard_bytes
        self.direct = direct
        self.retries = retries
        self.retry_s = retry_s
        self.pattern = pattern
        self.timed = timed
        self.errors = 0
        self._buf = None

    def read(self, index):
        shard = index % self.shards
        span = max(1, (self.shard_bytes - self.read_bytes) // 4096)
        offset = ((index // self.shards) * 7919 % span) * 4096  # aligned, spread over the file
        path = os.path.join(self.directory, self.pattern % shard)
        # Like webdataset's warn_and_continue: a failed read (a dead FUSE daemon answers
        # ENOTCONN) is retried, then the sample is skipped with a warning. The job keeps
        # running, slowly, which is the stall stallscope is there to explain.
        for attempt in range(self.retries + 1):
            try:
                return self._read(path, offset)
            except OSError as e:
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    print("lab rank worker: read %s failed: %s [%d errors]" % (
                        path, e.strerror or e, self.errors), flush=True)
                if attempt < self.retries:
                    time.sleep(self.retry_s)
        return b""

    def _read(self, path, offset):
        with _timed(path) if self.timed else _Untimed() as r:
            if self.direct:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                if self._buf is None:  # O_DIRECT needs an aligned buffer: mmap's is
                    self._buf = mmap.mmap(-1, (self.read_bytes + 4095) // 4096 * 4096)
            else:
                fd = os.open(path, os.O_RDONLY)
            try:
                if self.direct:
                    n = os.preadv(fd, [self._buf], offset)
                    data = self._buf[:min(n, self.read_bytes)]
                else:
                    data = os.pread(fd, self.read_bytes, offset)
            finally:
                os.close(fd)
            r.bytes = len(data)
        return data


class CachedSource:
    """A per-rank cache directory in front of a slow tier: an HTTP object store
    (``remote_url``) or a directory (``remote_dir``, its files named by
    ``remote_pattern``; the tier follows its mount). ``fill`` False models a cache that
    cannot keep what it fetched (a full or misconfigured cache volume), so it stays cold
    for the whole run."""

    def __init__(self, cache_dir, remote_url, shards, read_bytes, fill=False,
                 cache_tier="local-cache", remote_tier="object-store", run=1,
                 remote_dir=None, remote_pattern=SHARD_PATTERN, timed=True):
        # cache_dir None: no cache at all, every read goes to the slow tier.
        # run: consecutive samples come from one shard (a sequential shard reader), so
        # a partly cold cache gives runs of hits and runs of misses.
        self.cache_dir = cache_dir
        self.remote_url = remote_url.rstrip("/") if remote_url else None
        self.remote_dir, self.remote_pattern = remote_dir, remote_pattern
        self.shards = shards
        self.read_bytes = read_bytes
        self.fill = fill
        self.cache_tier = cache_tier
        self.remote_tier = remote_tier
        self.run = max(1, run)
        self.timed = timed  # False: nothing reported (plain open()/read() and HTTP GETs)

    def read(self, index):
        shard = (index // self.run) % self.shards
        name = shard_name(shard)
        path = os.path.join(self.cache_dir, name) if self.cache_dir else None
        hit = bool(path) and os.path.exists(path)
        if path and self.timed:
            _cache_lookup(self.cache_tier, hit)
        if hit:
            return self._read_file(path, self.cache_tier)
        if self.remote_dir:
            data = self._read_file(os.path.join(self.remote_dir, self.remote_pattern % shard))
        else:
            data = self._fetch(name)
        if self.fill and path:
            tmp = path + ".tmp%d" % os.getpid()
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return data

    def _read_file(self, path, tier=None):
        with _timed(path, tier) if self.timed else _Untimed() as r:
            with open(path, "rb") as f:
                data = f.read(self.read_bytes)
            r.bytes = len(data)
        return data

    def _fetch(self, name):
        """A ranged GET, retried as the cloud SDKs retry a throttled or failed request
        (exponential backoff from RETRY_BASE_S, at most RETRIES tries); every answer is
        reported with ``stallscope.storage_request``, the read once it succeeds."""
        url = "%s/%s" % (self.remote_url, name)
        report = stallscope.storage_request if self.timed else _unreported
        with _timed(url, self.remote_tier) if self.timed else _Untimed() as r:
            req = urllib.request.Request(url, headers={"Range": "bytes=0-%d" % (self.read_bytes - 1)})
            for attempt in range(RETRIES):
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        data = resp.read()
                    report(self.remote_tier, status=resp.status, retry=attempt > 0)
                    break
                except urllib.error.HTTPError as e:
                    report(self.remote_tier, status=e.code, retry=attempt > 0)
                    if e.code < 500 and e.code != 429 or attempt == RETRIES - 1:
                        raise
                time.sleep(RETRY_BASE_S * 2 ** attempt)
            r.bytes = len(data)
        return data


def from_plan(plan):
    """The source a rank plan asks for, or None (samples from thin air)."""
    src = plan.get("source")
    if not src:
        return None
    if src["kind"] == "files":
        return FileSource(src["dir"], src["shards"], src["read_bytes"], src["shard_bytes"],
                          direct=src.get("direct", False), pattern=src.get("pattern", SHARD_PATTERN),
                          timed=src.get("timed", True))
    if src["kind"] == "cached":
        return CachedSource(src.get("cache_dir"), src.get("remote_url"), src["shards"], src["read_bytes"],
                            fill=src.get("fill", False), run=src.get("run", 1),
                            remote_dir=src.get("remote_dir"),
                            remote_pattern=src.get("remote_pattern", SHARD_PATTERN),
                            timed=src.get("timed", True))
    raise ValueError("unknown source kind %r" % src["kind"])
