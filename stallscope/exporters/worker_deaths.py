"""Why a loader worker died: its exit signal joined with the evidence on its node.

The errors users see say only "DataLoader worker (pid N) is killed by signal: Bus error"
or "... Killed" (pytorch/pytorch#5040, #8976, #108861). The kernel knows more:

- SIGBUS with the rank's /dev/shm (nearly) full: a page of a shared-memory mapping could
  not be backed (tmpfs out of space), ``shm_exhaustion``. torch's own batch buffers are
  fallocate'd and fail with ENOSPC instead; SIGBUS comes from mappings that are not
  (multiprocessing.shared_memory, numpy memmaps on /dev/shm, native libraries).
- SIGKILL with the OOM-kill count of the worker's memory cgroup up since it was last
  read (v2 ``memory.events`` ``oom_kill``, counted up the hierarchy; v1
  ``memory.oom_control`` ``oom_kill``, only in the victim's own cgroup): the pod's
  memory limit, ``memory_limit``.
- SIGSEGV, SIGABRT, SIGILL, SIGFPE: a crash in native code, ``native_crash``.
- SIGKILL without an OOM kill: something killed it (``killed``); anything else: ``other``.

Pure readers and the rule; the workers exporter calls them when a worker is seen dead.
"""
from __future__ import annotations

import os
from typing import Any

from ..system import cgroups
from ..system.procfs import read_keyed, read_text
from ..vocabulary import cause

REASONS = ("shm_exhaustion", "memory_limit", "native_crash", "killed", "other")
NATIVE = frozenset(("SIGSEGV", "SIGABRT", "SIGILL", "SIGFPE"))
# The shm cause's own co-occurrence line: "nearly full" means the same everywhere.
SHM_FULL = next(ln.threshold for ln in cause("shm_exhaustion").lines if ln.signal == "shm_used_ratio")
NO_LIMIT = 1 << 60   # v1 reports "no limit" as a page-rounded LLONG_MAX


def shm_used_ratio(path: str) -> float | None:
    """Used share of the tmpfs at ``path`` (statvfs), or None when unreadable."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if not st.f_blocks:
        return None
    return 1.0 - st.f_bfree / st.f_blocks


def memory_dir(layout: cgroups.Layout, cg: cgroups.Cgroup | None) -> tuple[str | None, str | None]:
    """(directory of the memory cgroup, "v1"/"v2"): v1 where a v1 hierarchy has memory."""
    if cg is None:
        return None, None
    if "memory" in layout.v1 and cg.v1.get("memory") is not None:
        path = layout.resolve_v1("memory", cg.v1["memory"])
        return layout.v1_dir("memory", path), "v1"
    if layout.v2 and cg.v2 is not None:
        return layout.v2_dir(layout.resolve_v2(cg.v2) or cg.v2), "v2"
    return None, None


def oom_kills(directory: str | None, version: str | None) -> int | None:
    if directory is None:
        return None
    name = "memory.events" if version == "v2" else "memory.oom_control"
    return read_keyed(os.path.join(directory, name)).get("oom_kill")


def memory_limit(directory: str | None, version: str | None) -> int | None:
    """The cgroup's memory limit in bytes, or None for none."""
    if directory is None:
        return None
    text = read_text(os.path.join(directory, "memory.max" if version == "v2" else "memory.limit_in_bytes"))
    if text is None or text.strip() == "max":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return None if value >= NO_LIMIT else value


def memory_used(directory: str | None, version: str | None) -> int | None:
    """What the cgroup charges now in bytes (memory.current; v1 memory.usage_in_bytes),
    or None where unreadable."""
    if directory is None:
        return None
    name = "memory.current" if version == "v2" else "memory.usage_in_bytes"
    text = read_text(os.path.join(directory, name))
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def classify(signal: str | None, shm_ratio: float | None, oom_delta: int | None) -> str:
    """The reason for one exit by ``signal`` given the node's evidence at that moment."""
    if signal == "SIGBUS" and shm_ratio is not None and shm_ratio >= SHM_FULL:
        return "shm_exhaustion"
    if signal == "SIGKILL":
        return "memory_limit" if oom_delta else "killed"
    if signal in NATIVE:
        return "native_crash"
    return "other"


def explain(death: dict[str, Any]) -> str:
    """One sentence for diagnose and the API."""
    who = "Loader worker %s of rank %s" % (death["pid"], death.get("rank", "?"))
    sig, reason = death["signal"], death["reason"]
    if reason == "shm_exhaustion":
        return "%s died of %s with /dev/shm %.0f%% full: shared memory ran out." % (
            who, sig, 100 * death["shm_used_ratio"])
    if reason == "memory_limit":
        text = "%s was OOM-killed (%s; the cgroup's oom_kill count rose by %d)" % (
            who, sig, death["oom_kill_delta"])
        if death.get("memory_limit_bytes"):
            text += " at the pod's memory limit of %.0f MiB" % (death["memory_limit_bytes"] / 2**20)
        if death.get("last_rss_bytes"):
            text += "; its last RSS was %.0f MiB" % (death["last_rss_bytes"] / 2**20)
            if death.get("rss_growth_bytes_per_second") is not None:
                text += ", growing %.1f MiB/s" % (death["rss_growth_bytes_per_second"] / 2**20)
        return text + "."
    if reason == "native_crash":
        return "%s crashed in native code (%s)." % (who, sig)
    if reason == "killed":
        return "%s was killed (%s) with no OOM kill recorded in its memory cgroup." % (who, sig)
    return "%s ended by %s." % (who, sig)
