"""Part ``hangs``: a rank blocked in next() past ``--hangs.threshold`` seconds is
triaged without a human. The agent dumps the Python stacks of the rank's main process
and every loader worker once with py-spy (diagnose/stacks.py, classified by
diagnose/classify.py), reads where each waits in the kernel (system/blocked.py: state,
system call, file, mount) and keeps one result per rank, the latest, for
``/api/v1/diagnosis``, ``/api/v1/ranks`` and diagnose: "rank 3 blocked in next() for
94 s; worker 41207 in D state in read() on /mnt/data (FUSE, stuck); workers 41208-41210
idle waiting for indices".

Pauses: py-spy stops a process for a few ms to read a consistent stack. A process in D
state is read with --nonblocking instead: its ptrace stop would wait for the stuck call
(py-spy would time out) and would turn a FUSE wait that a signal can still end into one
only a fatal signal ends. Each blocked call is triaged once, one capture at a time in a
thread of its own (a dump takes up to stacks.TIMEOUT), and a process (PID and start
time) is paused at most once per threshold whatever the calls and ranks. Memory: one
result per live rank, MAX_PAUSED processes remembered.

Needs ptrace (root, or CAP_SYS_PTRACE as in the ptrace overlay) and py-spy; without
them the result carries the reason and the agent says it once.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

from ...diagnose import stacks
from ...host import Part, log
from ...host.options import flag
from ...host.report import HookReport
from ...system import blocked, procfs

MAX_PAUSED = 4096
FS_CALLS = {"read", "pread64", "readv", "preadv", "preadv2", "open", "openat", "openat2", "stat",
            "lstat", "newfstatat", "statx", "statfs", "fstat", "fstatfs", "getdents64", "lseek",
            "write", "fsync", "fdatasync"}


@dataclasses.dataclass(frozen=True)
class HangOptions:
    threshold: float = flag(60.0, "--hangs.threshold",
                            "Dump the stacks of a rank blocked in next() this long (py-spy, once "
                            "per blocked call; each process paused at most once per threshold). "
                            "0: never.", lo=0, hi=86400, metavar="SECONDS")


class HangsPart(Part):
    name = "hangs"
    interval = 1.0

    def __init__(self, host: Any, options: HangOptions = HangOptions()) -> None:
        super().__init__(host)
        self.threshold = options.threshold
        self.blocked: dict[Any, int] = {}     # rank key -> since_ns of its blocked next() call
        self.done: dict[Any, int] = {}        # rank key -> since_ns of the call triaged last
        self.results: dict[Any, dict[str, Any]] = {}    # rank key -> the latest triage
        self.paused: collections.OrderedDict[tuple[int, int], float] = collections.OrderedDict()
        self.pauses = 0                       # py-spy dumps that paused a process, all told
        self.busy: threading.Thread | None = None
        self.said = False

    # -- inputs (ingest thread) -----------------------------------------------------
    def handle(self, report: HookReport, rank: Any) -> None:
        if not report.main:
            return
        since = report.blocked_since_ns
        with self.lock:
            if since is not None:
                self.blocked[rank.key] = since
            elif len(report.events):  # a batch came: that call is over
                self.blocked.pop(rank.key, None)

    def forget(self, key: Any) -> None:
        with self.lock:
            for d in (self.blocked, self.done, self.results):
                d.pop(key, None)

    # -- scheduler ------------------------------------------------------------------
    def tick(self) -> None:
        if self.threshold <= 0 or (self.busy is not None and self.busy.is_alive()):
            return
        now_ns = time.monotonic_ns()
        limit = int(self.threshold * 1e9)
        with self.lock:
            due = [(k, s) for k, s in self.blocked.items()
                   if now_ns - s >= limit and self.done.get(k) != s]
        live = {r.key: r for r in self.host.ranks() if not r.exited}
        for key, since in due:
            rank = live.get(key)
            if rank is None or not rank.pid:
                continue
            with self.lock:
                self.done[key] = since
            self.busy = threading.Thread(target=self._triage, args=(rank, since),
                                         name="stallscope-hangs", daemon=True)
            self.busy.start()
            return  # one at a time: the next due rank waits for the next tick

    def _triage(self, rank: Any, since_ns: int) -> None:
        try:
            result = self.capture(rank, since_ns)
        except Exception as e:  # a triage must never take the scheduler down
            result = {"error": "%s: %s" % (type(e).__name__, e), "processes": []}
        with self.lock:
            if rank.key in self.blocked or rank.key in self.done:
                self.results[rank.key] = result

    def capture(self, rank: Any, since_ns: int) -> dict[str, Any]:
        blocked_s = (time.monotonic_ns() - since_ns) / 1e9
        head = {"rank": rank.ident["rank"], "job": rank.ident["job"], "pod": rank.ident["pod"],
                "blocked_since_ns": since_ns, "blocked_seconds": round(blocked_s, 1),
                "captured_at": round(time.time(), 3), "threshold_seconds": self.threshold}
        try:
            py_spy = stacks.find_py_spy()
        except stacks.StacksError as e:
            return self._failed(head, str(e))
        targets = [(rank.pid, "main")] + [(w, "worker") for w in rank.worker_pids if w]
        procs = [self._one(py_spy, pid, role) for pid, role in targets]
        if all(p.get("error") for p in procs):
            return self._failed(head, procs[0]["error"], procs)
        return dict(head, processes=procs, summary=summary(head, procs))

    def _failed(self, head: dict[str, Any], error: str, procs: Any = ()) -> dict[str, Any]:
        if not self.said:
            self.said = True
            log("hang triage cannot dump stacks: %s" % error)
        return dict(head, processes=list(procs), error=error,
                    summary="rank %s blocked in next() for %.0f s; no stacks: %s" % (
                        head["rank"], head["blocked_seconds"], error))

    def _one(self, py_spy: str, pid: int, role: str) -> dict[str, Any]:
        kernel = blocked.view(self.host.procfs, pid)
        if kernel is None:
            return {"pid": pid, "role": role, "error": "gone", "paused": False}
        stuck = kernel["state"] == "D"
        ident = (pid, procfs.start_time(self.host.procfs, pid) or 0)
        now = time.monotonic()
        with self.lock:
            last = self.paused.get(ident)
            may_pause = last is None or now - last >= self.threshold
        if not stuck and last is not None and not may_pause:
            return dict(kernel, pid=pid, role=role, paused=False,
                        error="paused %.0f s ago: not again within the threshold" % (now - last))
        out = stacks.one(py_spy, pid, role, nonblocking=stuck)
        paused = not stuck
        if paused:
            with self.lock:
                self.paused[ident] = now
                self.paused.move_to_end(ident)
                while len(self.paused) > MAX_PAUSED:
                    self.paused.popitem(last=False)
                self.pauses += 1
        return dict(out, **kernel, paused=paused)

    # -- outputs --------------------------------------------------------------------
    def latest(self, key: Any) -> dict[str, Any] | None:
        with self.lock:
            return self.results.get(key)

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        return {"hang": self.latest(rank.key)}


def describe(p: dict[str, Any]) -> str:
    """What one process is doing, in words: the kernel's view where it waits on a file,
    else its stack's class."""
    call, state = p.get("syscall"), p.get("state")
    if call in FS_CALLS and p.get("mount"):
        fs = p.get("fstype") or "?"
        kind = "FUSE" if fs.startswith("fuse") else fs
        where = "in D state" if state == "D" else "sleeping" if state == "S" else "running"
        return "%s in %s() on %s (%s, stuck)" % (where, call, p["mount"], kind)
    if p.get("error") and not p.get("class"):
        return "not dumped (%s)" % p["error"]
    cls = p.get("class")
    if p["role"] == "worker" and cls == "idle":
        return "idle waiting for indices"
    if p["role"] == "main" and cls == "ipc_wait":
        return "waiting for a batch from the workers"
    text = "%s at %s" % (cls, p.get("where")) if p.get("where") else str(cls)
    return ("in D state, " + text) if state == "D" else text


def _pids(pids: list[int]) -> str:
    pids = sorted(pids)
    runs: list[list[int]] = []
    for p in pids:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return ", ".join("%d-%d" % (r[0], r[-1]) if len(r) > 2 else
                     ", ".join(str(x) for x in r) for r in runs)


def summary(head: dict[str, Any], procs: list[dict[str, Any]]) -> str:
    """One line: how long, then each worker group (stuck ones first), then the main process."""
    groups: dict[str, list[int]] = {}
    for p in procs:
        if p["role"] == "worker":
            groups.setdefault(describe(p), []).append(p["pid"])
    order = sorted(groups.items(), key=lambda g: ("stuck" not in g[0], "idle" in g[0], min(g[1])))
    parts = ["rank %s blocked in next() for %.0f s" % (head["rank"], head["blocked_seconds"])]
    parts += ["%s %s %s" % ("workers" if len(pids) > 1 else "worker", _pids(pids), text)
              for text, pids in order]
    main = [p for p in procs if p["role"] == "main"]
    if main:
        parts.append("main process %d %s" % (main[0]["pid"], describe(main[0])))
    return "; ".join(parts)
