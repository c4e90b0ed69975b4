"""``--stacks``: one py-spy dump per PID of the rank (the main process and each loader
worker; ``py-spy dump --json`` ignores ``--subprocesses`` and returns only the parent),
each main thread classified (classify.py), with counts and a reading.

py-spy pauses each target for a few milliseconds (no ``--nonblocking``: a consistent
stack matters more here than a few ms of one step). It needs ptrace: root, or
CAP_SYS_PTRACE, within what kernel.yama.ptrace_scope allows.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from ..system import procfs
from .classify import CLASSES, classify, where

PY_SPY_ENV = "STALLSCOPE_PY_SPY"
TIMEOUT = 15.0
YAMA = "/proc/sys/kernel/yama/ptrace_scope"


class StacksError(Exception):
    pass


def _runnable(path: str) -> bool:
    # execve checks the effective credentials (capabilities included); plain access(2)
    # checks the real ones, which can say no to a binary this process may well run.
    effective = os.access in os.supports_effective_ids
    return os.path.isfile(path) and os.access(path, os.X_OK, effective_ids=effective)


def find_py_spy() -> str:
    """$STALLSCOPE_PY_SPY, else py-spy on PATH, else next to this Python (a venv's bin)."""
    given = os.environ.get(PY_SPY_ENV)
    if given:
        if _runnable(given):
            return given
        raise StacksError("py-spy not found at %s=%s" % (PY_SPY_ENV, given))
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if _runnable(beside):
        return beside
    raise StacksError("py-spy not found: install it with pip install 'stallscope[stacks]' "
                      "(or set %s)" % PY_SPY_ENV)


def ptrace_hint() -> str:
    scope = None
    try:
        with open(YAMA) as f:
            scope = f.read().strip()
    except OSError:
        pass
    text = ("run diagnose as root on the node, or grant CAP_SYS_PTRACE (Kubernetes: "
            "securityContext.capabilities.add: [SYS_PTRACE], plus hostPID to see the pod's "
            "processes)")
    if scope is not None:
        text += ("; kernel.yama.ptrace_scope is %s (1: only with CAP_SYS_PTRACE unless tracing "
                 "a descendant, 2: CAP_SYS_PTRACE only, 3: never)" % scope)
    return text


def dump(py_spy: str, pid: int, timeout: float = TIMEOUT, nonblocking: bool = False) -> list[dict[str, Any]]:
    """The threads py-spy sees in ``pid``; StacksError with a one-line reason.
    ``nonblocking``: read its memory without pausing it (for a process stuck in the
    kernel, whose ptrace stop would wait for the stuck call: agent/parts/hangs.py)."""
    cmd = [py_spy, "dump", "--pid", str(pid), "--json"] + (["--nonblocking"] if nonblocking else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StacksError("py-spy dump of PID %d took over %.0fs" % (pid, timeout)) from None
    except OSError as e:
        raise StacksError("cannot run py-spy at %s: %s" % (py_spy, e.strerror or e)) from e
    if p.returncode == 0:
        try:
            threads: list[dict[str, Any]] = json.loads(p.stdout)  # py-spy's JSON, one object a thread
            return threads
        except ValueError as e:
            raise StacksError("py-spy gave no JSON for PID %d" % pid) from e
    err = p.stderr or p.stdout
    if "permission denied" in err.lower() or "operation not permitted" in err.lower():
        raise StacksError("ptrace not permitted for PID %d: %s" % (pid, ptrace_hint()))
    first = next((line for line in err.splitlines() if line.startswith("Error:")), err.strip().split("\n")[0])
    raise StacksError("py-spy dump of PID %d failed: %s" % (pid, first.replace("Error: ", "")))


def is_local(pid: int, ns_pid: int | None = None) -> bool:
    """Whether ``pid`` here is the trainer's process: the agent's PIDs are host PIDs of
    its node, and on another machine the same number is someone else. The innermost
    NSpid of /proc/PID/status must be the PID the trainer saw itself as."""
    if procfs.stat("/proc", pid) is None:
        return False
    inner = procfs.ns_pid("/proc", pid)
    return ns_pid is None or inner is None or inner == int(ns_pid)


def main_thread(threads: list[dict[str, Any]], pid: int) -> dict[str, Any]:
    for t in threads:
        if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread":
            return t
    return threads[0] if threads else {}


def one(py_spy: str, pid: int, role: str, nonblocking: bool = False) -> dict[str, Any]:
    try:
        threads = dump(py_spy, pid, nonblocking=nonblocking)
    except StacksError as e:
        return {"pid": pid, "role": role, "class": None, "error": str(e)}
    t = main_thread(threads, pid)
    cls, frame, line = classify(t, role, pid)
    return {"pid": pid, "role": role, "class": cls, "where": where(frame) if frame else None,
            "line": line or None, "active": t.get("active"), "threads": len(threads),
            "frames": [where(f) for f in (t.get("frames") or [])[:8]]}


def reading(main: str | None, workers: collections.Counter[str]) -> str:
    n = sum(workers.values())
    if not n:
        return "No worker stacks (num_workers=0 or none answered)."
    top, k = workers.most_common(1)[0]
    share = "%d of %d workers" % (k, n)
    text = {
        "fetch": "%s are reading data: the loader waits on storage or the network." % share,
        "decode": "%s are decoding or transforming samples: per-sample CPU work sets the pace." % share,
        "collate": "%s are collating batches." % share,
        "ipc_wait": "%s wait on IPC inside the dataset (a queue, a pipe or a thread pool)." % share,
        "idle": "%s are idle, waiting for work: the loader is ahead of the loop." % share,
        "other": "%s run dataset code that matches no known loader phase; see their frames." % share,
        "outside_loader": "%s are outside the loader." % share,
    }[top]
    if top == "idle" and main == "ipc_wait":
        text = ("%s are idle while the loop waits for a batch: batches are slow to get through "
                "IPC (shared memory, pin memory) or the workers restart." % share)
    return text


def collect(rank: Mapping[str, Any]) -> dict[str, Any]:
    """Dump the rank's main process and workers (a /api/v1/ranks entry)."""
    py_spy = find_py_spy()
    pid = rank.get("pid")
    if not pid:
        raise StacksError("the agent knows no PID for rank %s" % rank.get("rank"))
    if not is_local(pid, rank.get("ns_pid")):
        raise StacksError("PID %d of rank %s is not on this machine: run --stacks on node %s "
                          "(e.g. in the node's agent pod)" % (pid, rank.get("rank"), rank.get("node")))
    targets = [(pid, "main")] + [(w, "worker") for w in rank.get("worker_pids") or [] if w]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        procs = list(pool.map(lambda t: one(py_spy, *t), targets))
    errors = [p["error"] for p in procs if p.get("error")]
    if errors and all(p.get("error") for p in procs):
        raise StacksError(errors[0])
    workers = collections.Counter(p["class"] for p in procs if p["role"] == "worker" and p["class"])
    main = procs[0]["class"]
    return {"py_spy": py_spy, "processes": procs, "main": main,
            "workers": {c: workers.get(c, 0) for c in CLASSES},
            "reading": reading(main, workers), "errors": errors}
