"""loaderstate: what every loader worker and the training process are doing, sampled from
procfs at a fixed rate, with no line of instrumentation (issue 30, items 1 and 2).

A sampler thread of its own makes ``--exporter.loaderstate.rate`` rounds a second on
average, at random gaps (GAP_LO..GAP_HI of the mean), each over every accepted rank's
tasks: its main thread, its pin-memory thread (torch names it ``pt_data_pin``) and every
accepted worker's main thread (system/taskstate.py says what is read and how it is
classified). Each interval between looks at a task is split into the declared
states (vocabulary LOADER_STATES): on CPU and waiting for CPU by its ``schedstat``
deltas, the rest by the call it is blocked in. A blocked storage read is kept with the
kind of its mount and the rank's own mount point; an open or stat (its path is only in the
task's memory, never read) or a fault on a mapped file is storage on an unattributed mount.

Per rank over ``--exporter.loaderstate.window`` seconds: the share of worker-time in each
state (and per mount), and the training process's split. ``/api/v1/ranks`` carries the
split (``loader_state``); per pod, six worker-state shares and the main process's
CPU-wait share are exported (off the per-rank series budget), and recorded as the
correlator's signals. Without the right to read ``syscall`` (ptrace-read over the task)
the off-CPU time is ``other`` and this is said once.

Cost (benchmarks/bench_loaderstate.py, this 2-core machine, 64 workers and a main thread,
all-in: the thread, and collect() at a scrape a second): see RATE_HZ. A blocked task that
has not run since the previous look is not read again beyond its schedstat; the same
bytes of a task's syscall file are not classified again. On by default.

Only the rank's accepted PIDs are read; no path of another pod is ever looked at, and
no path at all is exported (the mount's kind only; the mount point in the rank's API).
"""
from __future__ import annotations

import collections
import dataclasses
import os
import random
import threading
import time
from typing import Any

from ..host.families import family
from ..host.options import flag
from ..system import taskstate
from ..system.procfs import mountinfo, pid_path, read_text
from ..vocabulary import DATA_WAIT_LINE, LOADER_STATES, signal
from . import base

STATES = tuple(s.name for s in LOADER_STATES)
EXPORTED = ("on_cpu", "cpu_wait", "storage", "network", "idle", "sleeping")  # per-pod worker shares
WORKER_SIGNALS = {s: signal("loader_workers_%s_ratio" % s).name for s in EXPORTED}
MAIN_CPU_WAIT = signal("loader_main_cpu_wait_ratio").name
MAIN_ON_CPU = signal("loader_main_on_cpu_ratio").name
MAX_WORKERS = 128            # worker tasks of one rank sampled, at most
FD_CACHE_S = 5.0             # what a descriptor is open on (and a pin thread), re-read after this long
# While a rank's loop is not waiting on its loader, its workers' blocked calls are read
# once every DETAIL_S at most and their last state carried in between: their on-CPU and
# CPU-wait time stay exact (schedstat deltas every round), and what they wait on matters
# to a diagnosis only while the loop waits, when every round reads it.
DETAIL_S = 1.0
# A worker found in a poll holding no internet socket (an idle one polling its index
# queue, the common case) is looked at again only after this long: listing a process's
# descriptors is the costly part (64 polling workers every FD_CACHE_S took ~0.4 % of a
# core in benchmarks/bench_agent.py's 8 x 8 run). A worker of a rank whose loop waits is
# looked at again after FD_CACHE_S: a fetch through a cache opens its connection only on
# a miss, so a worker first found polling its index queue between misses read as idle
# for 30 s, and a cold cache's fetches with it (issue 49: a drawn cache-miss run's
# workers 99 % idle while the loop waited 16 % of its step).
NO_INTERNET_S = 30.0
UNATTRIBUTED = "unattributed"  # storage time in an open/stat or a page fault: no descriptor
# Rounds a second on average. Each look splits the time since the previous one (its
# on-CPU and CPU-wait time exact from schedstat, the rest by the call the task is blocked
# in now), so the rate sets the estimate's sampling error, not what it measures. Issue 30
# asked for 10 Hz; looking at every task every round at 10 Hz cost 1.2-1.5 % of a core at
# 8 ranks x 8 busy workers (bench_agent.py), so a worker was looked at every 4th round on
# average (2.5 Hz a task) at 0.50-0.75 %. A look costs ~19 us of CPU alone in a round on
# this loaded 2-core VM against ~2 us back to back (the sampler's code and data are out of
# the caches after each sleep): the wake-ups, not the looks' instructions, were the cost.
# Rounds of every task at the same 2.5 Hz a task: 0.35-0.50 % in the same runs (issue 31:
# the agent's 2 % at 8 x 8). benchmarks/bench_loaderstate.py, 64 workers, the two ways
# alternately on 2026-12-06: idle 0.27 -> 0.14 %, busy 0.41 -> 0.21 %, busy with the loop
# waiting 0.56 -> 0.31 %, --moving 0.37 -> 0.23 % (its 70/30 split read 73/27, now 68/32;
# within 0.05 over 6 s in tests/exporters/test_loaderstate.py).
RATE_HZ = 2.5
# The gap between rounds is drawn uniform over GAP_LO..GAP_HI of the mean, whatever the
# looks find. Rounds on a fixed grid alias with periodic workers (one that sleeps exactly a
# period is found in the same state at every look); a gap that grew while consecutive
# looks agreed moved the estimate toward the states they held longest
# (benchmarks/bench_loaderstate.py --moving: 44 % idle for 30 %; real FUSE readers: 14-22 %
# of their storage time on the mount for 33 %).
GAP_LO, GAP_HI = 0.25, 1.75


def poll_site(raw: bytes | None) -> bytes:
    """What tells one poll of a process from another in its ``syscall`` line: the call's
    number and first two arguments (poll/ppoll: the pollfd array and its length;
    select/pselect6: nfds and the read set; epoll_wait: the epoll descriptor and its
    events array), never its timeout, which a Queue.get(timeout) computes anew each
    call. A DataLoader worker's polls of its index queue, sampled at 30 Hz for 6 s
    on 2026-12-07, were 4 distinct lines and 1-2 sites a worker."""
    return b" ".join(raw.split(None, 3)[:3]) if raw else b""


class Task:
    """What the sampler keeps of one task: whose it is, its descriptors, its schedstat at
    the last look and its off-CPU state then. One record a task, read by attribute: a
    look touched six dicts keyed by (pid, tid) before."""

    __slots__ = ("key", "rank", "role", "fd", "sysfd", "t", "on", "wait", "runs", "state",
                 "looks", "raw", "raw_at", "raw_state", "listed")

    def __init__(self, key: tuple[int, int], rank: Any, role: str) -> None:
        self.key, self.rank, self.role = key, rank, role
        self.fd: int | None = None      # on its schedstat
        self.sysfd: int | None = None   # on its syscall
        self.t: float | None = None     # the last look, and schedstat's on-CPU ns, run-queue ns
        self.on = self.wait = self.runs = 0  # and timeslices then
        self.state: tuple[str, str | None] | None = None  # its off-CPU state at the last read
        self.looks = 0
        # its syscall file's bytes at the last full read, when, and the state they gave
        self.raw: bytes | None = None
        self.raw_at = 0.0
        self.raw_state: tuple[str, str | None] | None = None
        # found idle in a poll: when its process's sockets were listed for it (monotonic)
        self.listed: float | None = None


@dataclasses.dataclass(frozen=True)
class LoaderStateOptions:
    rate: float = flag(RATE_HZ, "--exporter.loaderstate.rate",
                       "Rounds a second of the loader-state sampler, on average, at random gaps; "
                       "each round looks at every loader task.", metavar="HZ")
    window: float = flag(10.0, "--exporter.loaderstate.window",
                         "Seconds of samples the exported shares cover.", metavar="SECONDS")


class Split:
    """Seconds of task-time per state (and per mount for storage) over a window."""

    def __init__(self) -> None:
        self.by_state: collections.Counter[str] = collections.Counter()
        self.by_mount: collections.Counter[str] = collections.Counter()

    def add(self, state: str, seconds: float, mount: str | None = None) -> None:
        self.by_state[state] += seconds
        if mount is not None:
            self.by_mount[mount] += seconds

    def shares(self) -> dict[str, float]:
        total = sum(self.by_state.values())
        return {s: (self.by_state[s] / total if total else 0.0) for s in STATES}

    def as_json(self) -> dict[str, Any]:
        total = sum(self.by_state.values())
        mounts = {m: round(v / total, 4) for m, v in self.by_mount.items()} if total else {}
        return {"task_seconds": round(total, 3), "storage_by_mount": mounts,
                "shares": {s: round(v, 4) for s, v in self.shares().items() if v}}


class LoaderStateExporter(base.Exporter):
    name = "loaderstate"
    Options = LoaderStateOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.task: dict[tuple[int, int], Task] = {}  # (pid, tid) -> what is kept of the task
        self.jitter = random.Random(0)
        self.pins: dict[int, tuple[float, list[int]]] = {}              # pid -> (looked at, pin tids)
        self.fds: dict[tuple[int, int], tuple[float, str | None]] = {}  # (pid, fd) -> (read at, target)
        self.mounts: dict[str, list[tuple[str, str]]] = {}              # mount ns -> [(mountpoint, kind)]
        self.unix: dict[tuple[int, int], tuple[str, bool]] = {}        # (pid, fd) -> (socket, is unix)
        # (pid, poll_site) -> (read at, held an internet socket then)
        self.internet: dict[tuple[int, bytes], tuple[float, bool]] = {}
        self.kin_sockets: dict[int, tuple[float, frozenset[str]]] = {}  # pid -> (read at, its sockets)
        # rank key -> (its training process, one of its workers): whose descriptors a
        # task of the rank shares with the other side of the fork
        self.kin: dict[Any, tuple[int, int | None]] = {}
        # rank key -> deque of (second, {(role, state, mount): task-seconds}), a second an entry
        Round = dict[tuple[str, str, "str | None"], float]
        self.samples: dict[Any, collections.deque[tuple[int, Round]]] = {}
        self.totals: dict[Any, Round] = {}   # rank key -> the sum of its ring's entries
        self.sums: dict[Any, tuple[int, int]] = {}  # rank key -> (wait ns, step ns) at the last refresh
        self.waiting: dict[Any, bool] = {}   # rank key -> its loop waited on data since then
        self.ranks_at, self.ranks = -1.0, []  # the rank table, re-read once a second
        self.detail_at = float("-inf")       # when the last round read every blocked call
        self.no_syscall = False
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.sampled = 0

    # -- the sampler thread ------------------------------------------------------------
    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True, name="stallscope-loaderstate")
            self.thread.start()

    def gap(self) -> float:
        """Seconds to the next round: uniform over GAP_LO..GAP_HI of the mean period."""
        return (GAP_LO + (GAP_HI - GAP_LO) * self.jitter.random()) / max(0.1, self.options.rate)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                self.sample_once()
            except Exception as e:  # never take the agent down; say it once
                self.note("loader state sampling failed: %s" % e)
            next_at += self.gap()
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a loaded node): skip, do not burst
                next_at, delay = time.monotonic(), 0.0
            # a sleep, not stop.wait(): a timed wait on a lock cost ~2x a sleep's CPU a
            # wake-up on a VM (~0.15 ms against ~0.06), and at 10 Hz the wake-ups were
            # half of this thread's cost (benchmarks/bench_loaderstate.py --workers 1);
            # a stop is seen within a period
            time.sleep(delay)

    def tasks(self, rank: Any) -> list[tuple[str, int, int]]:
        """(role, pid, tid) of the rank's sampled tasks."""
        out: list[tuple[str, int, int]] = []
        if rank.pid:
            out.append(("main", rank.pid, rank.pid))
            out += [("pin", rank.pid, tid) for tid in self._pin_threads(rank.pid)]
        out += [("worker", w, w) for w in list(rank.worker_pids)[:MAX_WORKERS] if w]
        return out

    def _pin_threads(self, pid: int) -> list[int]:
        """The pin-memory thread(s) of ``pid``, looked for once every FD_CACHE_S."""
        now = time.monotonic()
        hit = self.pins.get(pid)
        if hit and now - hit[0] < FD_CACHE_S:
            return hit[1]
        try:
            tids = os.listdir(pid_path(self.host.procfs, pid, "task"))
        except OSError:
            tids = []
        pins = [int(t) for t in tids if t != str(pid) and (
            read_text(pid_path(self.host.procfs, pid, "task", t, "comm")) or "").strip() == "pt_data_pin"]
        if len(self.pins) > 4096:
            self.pins.clear()
        self.pins[pid] = (now, pins)
        return pins

    def _task(self, pid: int, tid: int, name: str) -> str:
        """A task's file: a process's main thread through ``/proc/<pid>/`` (its schedstat,
        state and syscall are the leader's: proc(5)), another thread's under ``task/``."""
        if pid == tid:
            return pid_path(self.host.procfs, pid, name)
        return pid_path(self.host.procfs, pid, "task", str(tid), name)

    def _open(self, task: Task) -> int | None:
        """A descriptor kept open on the task's schedstat: a re-read at offset 0 gives the
        current values (procfs seq files), so a sample costs one pread."""
        try:
            task.fd = os.open(self._task(task.key[0], task.key[1], "schedstat"), os.O_RDONLY)
        except OSError:
            return None
        return task.fd

    def _close(self, key: tuple[int, int]) -> None:
        """Forget a task (gone, or no longer the rank's): its descriptors closed."""
        task = self.task.pop(key, None)
        if task is None:
            return
        for fd in (task.fd, task.sysfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        task.fd = task.sysfd = None

    def sample_once(self) -> None:
        """One round: every task is looked at, and each rank's looks are added to its
        ring's entry for this second, of {(role, state, mount): task-seconds}, however
        many workers it has. The loop is written flat over one record a task: at 64
        workers each look's few microseconds are the part's cost
        (benchmarks/bench_loaderstate.py)."""
        now = self.host.clock()
        if now - self.ranks_at >= 1.0:  # a copy of the table each round would cost more than the round
            self._refresh(now)
        detail_round = now - self.detail_at >= DETAIL_S
        if detail_round:
            self.detail_at = now
        accs: dict[Any, dict[tuple[str, str, str | None], float]] = {}
        for task in list(self.task.values()):
            fd = task.fd
            if fd is None:
                fd = self._open(task)
                if fd is None:
                    self._close(task.key)  # gone: taken up again if the next table lists it
                    continue
            try:
                fields = os.pread(fd, 128, 0).split()
                on, wait, runs = int(fields[0]), int(fields[1]), int(fields[2])
            except (OSError, ValueError, IndexError):  # the task is gone (ESRCH)
                self._close(task.key)
                continue
            role = task.role
            task.looks += 1
            then, was_on, was_waiting, was_runs = task.t, task.on, task.wait, task.runs
            task.t, task.on, task.wait, task.runs = now, on, wait, runs
            if then is None or now <= then:
                continue
            acc = accs.get(task.rank)
            if acc is None:
                acc = accs[task.rank] = {}
            dt = now - then
            d_on = (on - was_on) / 1e9 if on > was_on else 0.0
            d_wait = (wait - was_waiting) / 1e9 if wait > was_waiting else 0.0
            if d_on > dt:
                d_on = dt
            if d_on + d_wait > dt:
                d_wait = dt - d_on
            if d_on:
                k = (role, "on_cpu", None)
                acc[k] = acc.get(k, 0.0) + d_on
            if d_wait:
                k = (role, "cpu_wait", None)
                acc[k] = acc.get(k, 0.0) + d_wait
            rest = dt - d_on - d_wait
            if rest > 0.001:
                # a task that has not run since the last look (schedstat's timeslice count
                # unchanged) is still blocked where it was: not read again; nor is a worker
                # while its rank's loop does not wait (DETAIL_S). One found idle in a poll
                # is read again once its descriptors are due a new listing: a fetch that
                # began within FD_CACHE_S of the last listing and hangs (a server that
                # never answers) never runs again, and read as idle for as long as it hung.
                state = task.state
                if state is None or (runs != was_runs and (
                        role != "worker" or detail_round or self.waiting.get(task.rank, True))):
                    state = task.state = self._look(task, now)
                elif task.listed is not None and self._listing_due(task):
                    state = task.state = self._look(task, now, relist=True)
                k = (role, state[0], state[1])
                acc[k] = acc.get(k, 0.0) + rest
        if accs:
            self._add(accs, now)
        self.sampled += 1

    def _listing_due(self, task: Task) -> bool:
        """Whether the internet sockets of ``task``'s process, found idle in a poll, were
        listed longer ago than _internet trusts them (FD_CACHE_S while its rank's loop
        waits, NO_INTERNET_S otherwise; its own clock, time.monotonic)."""
        trusted = FD_CACHE_S if self.waiting.get(task.rank, True) else NO_INTERNET_S
        return task.listed is not None and time.monotonic() - task.listed >= trusted

    def _refresh(self, now: float) -> None:
        """Once a second: the rank table, whose tasks are sampled (new ones looked at from
        this round, departed ones forgotten) and which ranks' loops wait."""
        self.ranks_at, self.ranks = now, list(self.host.ranks())
        self.kin = {r.key: (r.pid, next((w for w in r.worker_pids if w), None)) for r in self.ranks if r.pid}
        tasks_of = {r.key: self.tasks(r) for r in self.ranks}
        self.waiting = {r.key: self._waited(r) for r in self.ranks}
        owner = {(pid, tid): (rank_key, role)
                 for rank_key, listed in tasks_of.items() for role, pid, tid in listed}
        for key in [k for k in self.task if k not in owner]:
            self._close(key)
        for key, (rank_key, role) in owner.items():
            task = self.task.get(key)
            if task is None:
                self.task[key] = Task(key, rank_key, role)
            else:
                task.rank, task.role = rank_key, role
        with self.lock:
            for key in [k for k in self.samples if k not in tasks_of]:
                del self.samples[key]
                self.totals.pop(key, None)
                self.sums.pop(key, None)

    def _look(self, task: Task, now: float, relist: bool = False) -> tuple[str, str | None]:
        """The task's off-CPU state from the call it is blocked in: the same bytes of its
        ``syscall`` file as at an earlier look within FD_CACHE_S (the same call from the
        same place) are the same state, not parsed and classified again (``relist``: they
        are, its sockets due a new listing)."""
        raw = self._syscall(task)
        if not relist and raw is not None and raw == task.raw and now - task.raw_at < FD_CACHE_S \
                and task.raw_state:
            return task.raw_state
        recheck = FD_CACHE_S if self.waiting.get(task.rank, True) else NO_INTERNET_S
        state, by_call = self._classify(task.role, task.key[0], task.key[1], raw, task.state,
                                        self._kin_of(task), recheck)
        if raw is not None and by_call:  # one that took stat's state (D or not) is read again
            task.raw, task.raw_at, task.raw_state = raw, now, state
        listing = self.internet.get((task.key[0], poll_site(raw))) if state[0] == "idle" else None
        task.listed = listing[0] if listing is not None else None
        return state

    def _add(self, accs: dict[Any, dict[tuple[str, str, str | None], float]], now: float) -> None:
        """Each rank's looks of a round into its ring, one entry a second (the window's
        edge moves a second at a time: an entry a round cost more than the looks of a
        rank of a few workers)."""
        second, keep_from = int(now), now - self.options.window
        with self.lock:
            for rank_key, acc in accs.items():
                ring = self.samples.get(rank_key)
                if ring is None:
                    ring = self.samples[rank_key] = collections.deque()
                total = self.totals.setdefault(rank_key, {})
                if ring and ring[-1][0] == second:
                    entry = ring[-1][1]
                else:
                    entry = {}
                    ring.append((second, entry))
                for k, v in acc.items():
                    entry[k] = entry.get(k, 0.0) + v
                    total[k] = total.get(k, 0.0) + v
                while ring and ring[0][0] + 1 <= keep_from:  # the whole second before the window
                    for k, v in ring.popleft()[1].items():
                        left = total.get(k, 0.0) - v
                        if left > 1e-9:
                            total[k] = left
                        else:
                            total.pop(k, None)

    def _waited(self, rank: Any) -> bool:
        """Whether the rank's loop waited on its loader over the line since the last look,
        or is blocked in next() now: from its histogram sums (the hook's own numbers)."""
        try:
            wait, step, blocked = int(rank.wait.sum_ns), int(rank.step.sum_ns), int(rank.provisional_ns)
        except (AttributeError, TypeError, ValueError):
            return True  # not known: read every round
        before = self.sums.get(rank.key)
        self.sums[rank.key] = (wait, step)
        if blocked > 0 or before is None:
            return True
        d_wait, d_step = wait - before[0], step - before[1]
        return d_step <= 0 or d_wait >= DATA_WAIT_LINE * d_step

    def _syscall(self, task: Task) -> bytes | None:
        """The bytes of the task's ``syscall`` file (the call it is blocked in), from a
        descriptor kept open on it (one pread, as for schedstat: an open and a Python
        file object per sample were most of a busy loader's cost). Access is checked at
        each read (proc(5): ptrace rights over the task); without it, said once, and never
        asked again."""
        if self.no_syscall:
            return None
        try:
            fd = task.sysfd
            if fd is None:
                fd = task.sysfd = os.open(self._task(task.key[0], task.key[1], "syscall"), os.O_RDONLY)
            return os.pread(fd, 256, 0)
        except PermissionError:
            self.no_syscall = True
            self.note("no right to read /proc/<pid>/task/<tid>/syscall (ptrace-read): loader "
                      "tasks off the CPU are 'other' (only stat and schedstat are read)")
        except OSError:
            pass
        return None

    def _off_cpu(self, role: str, pid: int, tid: int, kin: int | None = None) -> tuple[str, str | None]:
        """The state a task found now would have its off-CPU time put in (one look,
        nothing kept; ``kin``: the process on the other side of its fork, _kin_of)."""
        task = Task((pid, tid), None, role)
        try:
            return self._classify(role, pid, tid, self._syscall(task), None, kin)[0]
        finally:
            if task.sysfd is not None:
                os.close(task.sysfd)

    def _kin_of(self, task: Task) -> int | None:
        """The process on the other side of the fork from ``task``'s: a worker's training
        process, a training process's (or its pin thread's) first worker."""
        kin = self.kin.get(task.rank)
        if kin is None:
            return None
        return kin[0] if task.role == "worker" else kin[1]

    def _classify(self, role: str, pid: int, tid: int, raw: bytes | None,
                  was: tuple[str, str | None] | None, kin: int | None = None,
                  no_internet_s: float = NO_INTERNET_S) -> tuple[tuple[str, str | None], bool]:
        """(the state the task's off-CPU time since the last look is put in, whether the
        call alone decided it): the call it is blocked in now; one found running is on
        its way back from where it was (``was``, the last state found), so that is kept
        (``other`` when none)."""
        call = taskstate.parse_syscall(raw.decode("ascii", "replace")) if raw is not None else None
        if call is not None and call.running:
            return (was if was is not None else ("other", None)), False
        target = None
        if call is not None and call.first_arg is not None and call.kind in (
                "read", "write", "recv", "send"):
            target = self._fd(pid, call.first_arg)
        unix = False
        if target is not None and target.startswith("socket:") and call is not None \
                and call.first_arg is not None:
            unix = self._unix(pid, call.first_arg, target)
        internet = call is not None and call.kind == "poll" and self._internet(
            pid, kin, no_internet_s, poll_site(raw))
        s = taskstate.classify(role, None, call, target, unix, internet)
        by_call = s != "other"
        if s == "other":
            # the state decides only here (D: blocked in the kernel on storage), so stat is
            # read only for a task the call alone does not place
            stat = read_text(self._task(pid, tid, "stat")) or ""
            state = stat.rpartition(")")[2].split()[:1]
            s = taskstate.classify(role, state[0] if state else None, call, target, unix, internet)
        mount = None
        if s == "storage":
            # an open/stat names its path only in the task's memory (never read): its time
            # is storage on a mount not known, as is a fault on a mapped file
            mount = self._mount_of(pid, target) if target and target.startswith("/") else UNATTRIBUTED
        return (s, mount), by_call

    def _fd(self, pid: int, fd: int) -> str | None:
        now = time.monotonic()
        hit = self.fds.get((pid, fd))
        if hit and now - hit[0] < FD_CACHE_S:
            return hit[1]
        try:
            target: str | None = os.readlink(pid_path(self.host.procfs, pid, "fd", str(fd)))
        except OSError:
            target = None
        if len(self.fds) > 65536:
            self.fds.clear()
        self.fds[(pid, fd)] = (now, target)
        return target

    def _internet(self, pid: int, kin: int | None = None, no_internet_s: float = NO_INTERNET_S,
                  poll: bytes = b"") -> bool:
        """Whether ``pid`` held a socket to another host at its last look (every
        FD_CACHE_S: its descriptors listed, only for a task found in a poll). An HTTP
        client opens a connection a request or keeps a pool: either way a fetching worker
        holds one most of the time, an idle one that polls its index queue none (or its
        pool's idle connections: then its poll reads as network too). A worker inherits
        its training process's descriptors at fork, so both hold the process group's
        connections (gloo's TCP pairs, NCCL's bootstrap), opened before the workers
        started: a socket ``pid`` shares with ``kin`` (the other side of the fork,
        _kin_of) is the group's, not a fetch of its own (every idle worker of a multi-rank
        job read as network, 99.7 % of a healthy rank's workers' time in the lab's
        trainer-throttled run, and a training process polling its result queue would
        have too; issue 30). A rank without workers fetches in its training process,
        whose connections then all count.

        The listing is kept per poll (``poll``: poll_site): a worker that fetches
        through a cache polls its index queue between misses and a new connection during
        one, two different polls; one listing for both, made while it polled the queue,
        read every miss of the next FD_CACHE_S as idle (issue 49, draw 413 cache_miss:
        4 workers fetching 200 ms misses read 99 % idle while the loop waited)."""
        now = time.monotonic()
        hit = self.internet.get((pid, poll))
        if hit and now - hit[0] < (FD_CACHE_S if hit[1] else no_internet_s):
            return hit[1]
        own = taskstate.internet_sockets(self.host.procfs, pid)
        if own and kin and kin != pid:
            own = own - self._sockets_of(kin, now)
        held = bool(own)
        if len(self.internet) > 4096:
            self.internet.clear()
        self.internet[(pid, poll)] = (now, held)
        return held

    def _sockets_of(self, pid: int, now: float) -> frozenset[str]:
        """The internet sockets ``pid`` holds, listed every FD_CACHE_S."""
        hit = self.kin_sockets.get(pid)
        if hit and now - hit[0] < FD_CACHE_S:
            return hit[1]
        held = taskstate.internet_sockets(self.host.procfs, pid)
        if len(self.kin_sockets) > 4096:
            self.kin_sockets.clear()
        self.kin_sockets[pid] = (now, held)
        return held

    def _unix(self, pid: int, fd: int, target: str) -> bool:
        """Whether descriptor ``fd`` of ``pid`` (open on socket ``target``) is a unix
        socket; kept as long as the descriptor names the same socket."""
        hit = self.unix.get((pid, fd))
        if hit is not None and hit[0] == target:
            return hit[1]
        unix = taskstate.is_unix(taskstate.socket_protocol(self.host.procfs, pid, fd))
        if len(self.unix) > 65536:
            self.unix.clear()
        self.unix[(pid, fd)] = (target, unix)
        return unix

    def _mount_of(self, pid: int, path: str) -> str:
        """"<kind>:<mount point>" of the mount ``path`` is on, as ``pid`` sees it."""
        try:
            ns = os.readlink(pid_path(self.host.procfs, pid, "ns", "mnt"))
        except OSError:
            ns = "pid:%d" % pid
        if ns not in self.mounts:
            ms = mountinfo(self.host.procfs, pid) or []
            self.mounts[ns] = sorted(((m.mountpoint, taskstate.mount_kind(m.fstype)) for m in ms),
                                     key=lambda m: -len(m[0]))
            if len(self.mounts) > 1024:
                self.mounts = {ns: self.mounts[ns]}
        for point, kind in self.mounts[ns]:
            if path == point or path.startswith(point.rstrip("/") + "/"):
                return "%s:%s" % (kind, point)
        return "local:/"

    # -- reading it ---------------------------------------------------------------------
    def split(self, key: Any, seconds: float | None = None) -> dict[str, Split]:
        """{role: Split} of the rank over the last ``seconds`` (default: the window, from
        the running totals: a scrape adds no walk over the rounds)."""
        out: dict[str, Split] = {}
        with self.lock:
            if seconds is None or seconds >= self.options.window:
                rounds = [dict(self.totals.get(key, {}))]
            else:
                since = self.host.clock() - seconds
                rounds = [acc for second, acc in self.samples.get(key, ()) if second + 1 > since]
        for acc in rounds:
            for (role, state, mount), secs in acc.items():
                out.setdefault(role, Split()).add(state, secs, mount)
        return out

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        parts = self.split(rank.key)
        if not parts:
            return {}
        return {"loader_state": {role: s.as_json() for role, s in sorted(parts.items())}}

    def timeline_fields(self, rank: Any, seconds: float) -> dict[str, Any]:
        return self.rank_fields(rank)

    def collect(self) -> Any:
        self.start()
        workers = family("stallscope_loader_worker_time_ratio")
        main = family("stallscope_loader_main_cpu_wait_ratio")
        by_pod: dict[Any, tuple[dict[str, Split], Any]] = {}
        for rank in self.host.ranks():
            parts = self.split(rank.key)
            w, m = parts.get("worker"), parts.get("main")
            if w is not None:
                shares = w.shares()
                for s in EXPORTED:
                    self.record(rank.key, WORKER_SIGNALS[s], shares[s])
            if m is not None:
                main_shares = m.shares()
                self.record(rank.key, MAIN_CPU_WAIT, main_shares["cpu_wait"])
                self.record(rank.key, MAIN_ON_CPU, main_shares["on_cpu"])
            pod = (rank.ident.get("namespace"), rank.ident.get("pod"))
            merged, _ = by_pod.setdefault(pod, ({}, rank.labels))
            for role, sp in parts.items():
                into = merged.setdefault(role, Split())
                into.by_state.update(sp.by_state)
        for merged, labels in by_pod.values():
            if "worker" in merged:
                shares = merged["worker"].shares()
                for s in EXPORTED:
                    workers.add(dict(labels, state=s), shares[s])
            if "main" in merged:
                main.add(labels, merged["main"].shares()["cpu_wait"])
        return [workers.family, main.family]
