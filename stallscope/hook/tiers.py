"""Storage tier names for shard reads: a short, bounded vocabulary, never a shard ID.

A tier is where a read is served from: ``local`` disk, a ``fuse`` mount (Mountpoint for
S3, gcsfuse, blobfuse2, JuiceFS ...), ``nfs``, another ``network`` file system,
``memory`` (tmpfs), or a remote scheme (``http``, ``s3``, ``gcs`` ...). Paths are mapped
through the mount table (/proc/self/mountinfo, proc(5)): the longest mount point that
holds the path decides. Tier names become a Prometheus label, so anything outside the
vocabulary or past MAX_TIERS distinct names per process is reported as ``other``.
"""
from __future__ import annotations

import os
import re
import time

MAX_TIERS = 8
OTHER = "other"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
_NETWORK_FS = {"cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "9p", "glusterfs",
               "beegfs", "wekafs", "afs", "orangefs", "virtiofs"}
_MEMORY_FS = {"tmpfs", "ramfs", "hugetlbfs"}
_SCHEMES = {"http": "http", "https": "http", "s3": "s3", "s3a": "s3", "gs": "gcs",
            "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure", "adl": "azure",
            "hf": "hf", "ais": "ais", "pipe": "pipe", "hdfs": "hdfs", "memory": "memory"}
_MOUNTS_TTL_S = 5.0

_seen: list[str] = []  # tier names this process has used, in first-use order
_mounts: list[tuple[str, str]] | None = None  # [(mount point, fstype)] longest first
_mounts_read = 0.0
_by_dir: dict[str, str] = {}  # directory → tier, bounded


def bounded(name: str | None) -> str:
    """``name`` if valid and among this process's first MAX_TIERS - 1 tiers, else
    ``other`` (which makes the MAX_TIERS-th)."""
    if name in _seen:
        return name
    if not isinstance(name, str) or not _NAME.match(name) or len(_seen) >= MAX_TIERS - 1:
        return OTHER
    _seen.append(name)
    return name


def of_fstype(fstype: str) -> str:
    if fstype == "fuse" or fstype == "fuseblk" or fstype.startswith("fuse."):
        return "fuse"
    if fstype.startswith("nfs"):
        return "nfs"
    if fstype in _MEMORY_FS:
        return "memory"
    if fstype in _NETWORK_FS:
        return "network"
    return "local"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (proc(5)).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def read_mounts(path: str = "/proc/self/mountinfo") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if sep and len(fields) >= 5 and rest:
            out.append((_unescape(fields[4]), rest[0]))
    # Longest mount point first; for stacked mounts on one point the last listed wins.
    out.reverse()
    out.sort(key=lambda m: len(m[0]), reverse=True)
    return out


def _fresh_mounts() -> list[tuple[str, str]]:
    global _mounts, _mounts_read
    now = time.monotonic()
    if _mounts is None or now - _mounts_read > _MOUNTS_TTL_S:
        mounts = read_mounts()
        if mounts != _mounts:
            _by_dir.clear()  # a mount came or went: directories may have moved tiers
        _mounts, _mounts_read = mounts, now
    return _mounts


def _mount_fstype(path: str, mounts: list[tuple[str, str]]) -> str:
    for point, fstype in mounts:
        if path == point or path.startswith(point.rstrip("/") + "/"):
            return fstype
    return ""


def of_path(path: str | os.PathLike[str]) -> str:
    """Tier of a local path, by the file system of the mount that holds it. Lexical
    only (no realpath): resolving symlinks would send lookups into the mount itself,
    which hang when its daemon does."""
    mounts = _fresh_mounts()
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    tier = _by_dir.get(directory)
    if tier is None:
        if len(_by_dir) > 4096:
            _by_dir.clear()
        tier = _by_dir[directory] = of_fstype(_mount_fstype(directory, mounts))
    return tier


def of_url(url: str | os.PathLike[str]) -> str:
    """Tier of a URL or path: its scheme's tier, or the mount's for local paths."""
    scheme, sep, rest = str(url).partition(":")
    if not sep or "/" in scheme or len(scheme) == 1:  # a plain path (or a drive letter)
        return of_path(url)
    scheme = scheme.lower()
    if scheme == "file":
        return of_path(rest[2:] if rest.startswith("//") else rest)
    return _SCHEMES.get(scheme, OTHER)
