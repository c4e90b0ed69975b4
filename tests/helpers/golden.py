"""The golden run, shared by tests/golden (the exposition against metrics.prom) and
tests/vocabulary/test_emitted.py (what was emitted and recorded against the vocabulary).

An in-process agent, never started (no sockets, no threads of its own), reads the fake
``/proc``, ``/sys``, cgroup tree and root filesystem of the node described in
``tests/golden/fixtures/node.py`` (written into a temporary directory first by
tests/helpers/nodetree.py, see tests/golden/fixtures/README.md) with every exporter switched on,
``--exporter.workers.per-worker``, the simulated GPU and a dcgm-exporter endpoint
serving tests/data/dcgm/dcgm-exporter-k8s.txt. Fixed hook reports go through the
ingest's own ``handle`` (validation, reject counting, ``Agent.apply``); then the parts
are driven by hand in a fixed order: the GPU samplers polled, the exporters collected
twice under a fixed ``host.clock``, 2 s apart, the node's counters moved between the two
(the node's ``LATER``: CPU time, bytes read, run-queue wait, throttling, pressure, disk
and link counters), the loader, shard and correlator parts ticked.

The scenario: rank 0 of job ``llm`` in pod ml-team/llm-pretrain-worker-0 (PID 4242,
PID 1 in its namespace) with two loader workers (4243: in D state; 4244: a zombie
killed by SIGBUS). Each worker takes 0.3 s per batch, the loop computes 0.1 s per batch:
the loop waits 0.1 s every second batch, input-bound with too few workers; 2 ms of each
wait is transfer (the trainer's reports are wire v2 with the ready-wait column). Shard reads
on the s3fs mount are fast and the page cache mostly hits, so nothing else explains it.

Batch, read and GPU timestamps are fixed offsets before ``time.monotonic_ns()`` at the
start of the run, rounded down to a whole second (all within the last 40 s), so every
number derived from them is the same on every run; the exporters' samples are recorded
after the last batch, outside the window the correlator lines up.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any
from unittest import mock

import psutil
from prometheus_client import generate_latest

from stallscope import vocabulary
from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.agent.table import ingest
from stallscope.exporters import ExportersOptions
from stallscope.exporters.fuse import FuseOptions
from stallscope.exporters.gpu.options import GpuOptions
from stallscope.exporters.workers import WorkersOptions
from stallscope.host import Part
from tests.golden.fixtures import node
from tests.helpers import ROOT, nodetree
from tests.helpers.gpu import U0, DcgmServer, fixture

GOLDEN = os.path.join(ROOT, "tests", "golden")
GOLDEN_METRICS = os.path.join(GOLDEN, "metrics.prom")
GOLDEN_SIGNALS = os.path.join(GOLDEN, "signals.txt")

IDENT = node.IDENT
NODE = IDENT["node"]
MAIN = (node.MAIN.pid, node.MAIN.ns_pid)  # (PID on the node, PID in the pod's namespace)
WORKERS = tuple((w.pid, w.ns_pid) for w in node.WORKERS)
SHM_SIZE = node.SHM_SIZE            # the tmpfs mounted on the fixture's /dev/shm
SHM_USED = 1 << 20                  # bytes written into it (a multiple of any page size)

MS = 1_000_000
S = 1000 * MS

# Values no fixture can fix, replaced by MASK in the golden file (which stays a valid
# exposition): the wall time a collection took, and the latency of the FUSE probe
# (a real statvfs through the fixture's /proc/<pid>/root).
MASK = "NaN"
MASKED_SUFFIXES = ("_duration_seconds",)
MASKED_NAMES = ("stallscope_fuse_probe_seconds", "stallscope_stall_since_timestamp_seconds")
MASKED_SIGNALS = ("fuse_probe_seconds",)  # in signals.txt: the latency of that statvfs
HEADER = ("# Golden /metrics of the agent over tests/golden/fixtures (tests/helpers/golden.py).\n"
          "# Rewrite with: pytest tests/golden --update\n"
          "# Masked as %s: *_duration_seconds (wall time of a collection) and\n"
          "# stallscope_fuse_probe_seconds (latency of a real statvfs),\n"
          "# stallscope_stall_since_timestamp_seconds (a wall-clock time).\n" % MASK)


@dataclasses.dataclass(repr=False)
class Run:
    exposition: str                         # generate_latest() of the agent's registry
    families: list[Any]                     # what its collect() gave, that exposition's input
    exact: bool                             # /dev/shm was a tmpfs of known size
    inexact_why: str | None
    recorded: dict[tuple[Any, str], set[str]]  # (scope, signal) -> parts that recorded it
    last: dict[tuple[Any, str], float]      # (scope, signal) -> the value it recorded last
    stored: dict[Any, list[str]]            # scope -> agent.samples.signals(scope)
    emitted_by: dict[str, set[str]]         # part -> names of the families it emitted
    failures: list[str]                     # exporters or parts that failed to collect
    notes: dict[str, list[str]]             # what the parts noted (missing files ...)
    diagnosis: Any                          # the correlator's result for the rank (a Diagnosis)

    def __repr__(self) -> str:  # short, in a failing test's traceback
        return "<golden run: %d lines, %s>" % (
            self.exposition.count("\n"), "exact" if self.exact else "inexact: " + str(self.inexact_why))


# -- hook reports -----------------------------------------------------------------------
def _report(role: str, ns_pid: int, mono_ns: int, events=(), **extra: Any) -> bytes:
    msg = {"v": 1, "kind": "report", "id": IDENT, "pid": ns_pid, "role": role,
           "mono_ns": mono_ns, "wall_ns": time.time_ns() - (time.monotonic_ns() - mono_ns),
           "dropped_total": 0,
           "events": [list(e) for e in events]}
    msg.update(extra)
    return json.dumps(msg).encode()


def _report_v2(role: str, ns_pid: int, mono_ns: int, events, ready, **extra: Any) -> bytes:
    """A version 2 report: the batch events as binary columns, with the ready waits."""
    from array import array

    msg = {"v": 2, "kind": "report", "id": IDENT, "pid": ns_pid, "role": role,
           "mono_ns": mono_ns, "wall_ns": time.time_ns() - (time.monotonic_ns() - mono_ns),
           "dropped_total": 0, "n": len(events), "cols": 4}
    msg.update(extra)
    cols = [array("q", [e[k] for e in events]) for k in range(3)] + [array("q", ready)]
    return json.dumps(msg).encode() + b"\n" + b"".join(c.tobytes() for c in cols)


def ready_waits(events):
    """Of each wait, all but 2 ms waited for a ready batch (the rest is transfer)."""
    return [max(0, e[1] - 2 * MS) for e in events]


def timeline(base: int):
    """(main events, {worker ns PID: events}, shard reads) before ``base``."""
    end = base - 32 * S
    main = [(end, 2 * S, 2 * S)]  # the iterator's first batch: worker startup
    for k in range(1, 200):
        interval, wait = (200 * MS, 100 * MS) if k % 2 else (100 * MS, 0)
        end += interval
        main.append((end, wait, interval))
    first = main[0][0]
    (_, d_ns), (_, z_ns) = WORKERS  # the worker in D state, the zombie
    workers = {d_ns: [], z_ns: []}
    for i in range(100):
        t = first + 200 * MS + i * 300 * MS
        workers[d_ns].append((t, 300 * MS, 300 * MS))
        workers[z_ns].append((t - 5 * MS, 300 * MS, 300 * MS))
    reads = []
    for r in range(40):
        dur = 45 * MS if r % 20 == 19 else 20 * MS if r % 5 == 4 else 8 * MS
        batch = workers[d_ns][(r // 20) * 50 + (r % 20) * 2]  # 20 reads in each flush
        reads.append([batch[0] - MS, dur, 4 << 20, 0])
    return main, workers, reads


def reports(base: int):
    """The two flushes of every process, and the bad reports, as bytes."""
    main, workers, reads = timeline(base)
    (d_pid, d_ns), (z_pid, z_ns) = WORKERS
    loader = {"num_workers": 2, "prefetch_factor": 2, "batch_size": 32, "pin_memory": True,
              "persistent_workers": False, "worker_pids": [ns for _, ns in WORKERS]}
    slow = [[0, 45 * MS, "s3://datasets/llm/shard-000123.tar"]]
    first, second = [], []
    for out, lo, hi, dropped in ((first, 0, 100, 3), (second, 100, 200, 5)):
        events = main[lo:hi]
        extra = {"loader": loader, "dropped_total": dropped}
        sent = events[-1][0] + MS
        if lo == 0:
            extra["cuda"] = {"index": 0, "uuid": U0[4:]}  # as torch spells it
        else:  # the loop is inside next() again, for 150 ms so far
            extra["blocked_since_ns"] = events[-1][0] + 100 * MS
            sent = events[-1][0] + 250 * MS
        out.append((MAIN[0], _report_v2("main", MAIN[1], sent, events, ready_waits(events), **extra)))
        half = slice(lo // 2, hi // 2)
        mine = reads[lo // 5:hi // 5]
        # the s3fs daemon's requests as the loader reports them: one throttled and retried
        # in 120, far under the storage_errors line
        io = {"tiers": ["fuse", "page"], "reads": mine, "cache": [[1, 45, 5]], "slowest": slow,
              "requests": [[0, 119, 1, 0, 0, 0, 1]]}
        wd = workers[d_ns][half]
        out.append((d_pid, _report("worker", d_ns, wd[-1][0], wd, io=io)))
        wz = workers[z_ns][half]
        out.append((z_pid, _report("worker", z_ns, wz[-1][0], wz)))
    last = main[-1][0]
    bad = [
        (z_pid, _report("worker", z_ns, last, io={"tiers": ["Fuse Mount"], "reads": []})),
        (MAIN[0], _report("main", MAIN[1], last + 300 * MS, cuda={"index": -1, "uuid": U0})),
        (MAIN[0], b'{"v": 1, "kind": "report", '),
    ]
    return first, second, bad


# -- recording who records what ---------------------------------------------------------
class RecordSpy:
    """Wraps ``agent.samples.record`` and ``record_many`` to note which part recorded each
    (scope, signal):
    the first ``Part`` instance up the caller's stack (an exporter through
    ``Exporter.record``, the loader and shard parts in ``handle``, the gpu exporter in
    its samplers' sinks)."""

    def __init__(self, samples: Any) -> None:
        self.inner, self.inner_many = samples.record, samples.record_many
        self.by: dict[tuple[Any, str], set[str]] = collections.defaultdict(set)
        self.last: dict[tuple[Any, str], float] = {}  # the value recorded last
        samples.record, samples.record_many = self.record, self.record_many

    def _note(self, scope: Any, signal: str) -> None:
        frame = sys._getframe(2)
        part = "?"
        while frame is not None:
            me = frame.f_locals.get("self")
            if isinstance(me, Part):
                part = me.name
                break
            frame = frame.f_back
        self.by[(scope, signal)].add(part)

    def record(self, scope: Any, signal: str, value: float, t_ns: int | None = None) -> None:
        self._note(scope, signal)
        self.last[(scope, signal)] = value
        self.inner(scope, signal, value, t_ns)

    def record_many(self, scope: Any, signal: str, t_ns: Any, values: Any) -> None:
        self._note(scope, signal)
        if len(values):
            self.last[(scope, signal)] = float(values[-1])
        self.inner_many(scope, signal, t_ns, values)


# -- the run ----------------------------------------------------------------------------
def _mount_tmpfs(path: str) -> str | None:
    """Mount a tmpfs of SHM_SIZE on ``path`` and fill SHM_USED of it; None, or why not."""
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs on the fixture's /dev/shm (its sizes are exact only then)"
    if not shutil.which("mount"):
        return "needs mount(8) for the fixture's /dev/shm tmpfs"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=1777" % SHM_SIZE,
                           "stallscope-golden", path], capture_output=True, text=True)
    if done.returncode != 0:
        return "cannot mount a tmpfs on the fixture's /dev/shm: %s" % done.stderr.strip()
    with open(os.path.join(path, "torch_%d_0" % MAIN[0]), "wb") as f:
        f.write(b"\0" * SHM_USED)
    return None


def _config(tree: str, dcgm_url: str) -> Config:
    o = AgentOptions(node=NODE, procfs=os.path.join(tree, "proc"), sysfs=os.path.join(tree, "sys"),
                     cgroupfs=os.path.join(tree, "cgroup"), rootfs=os.path.join(tree, "root"),
                     socket=os.path.join(tree, "hook.sock"), listen="127.0.0.1:0")
    # Deadlines far above what the fixture needs, so a loaded test machine cannot turn a
    # slow FUSE probe or dcgm-exporter fetch into a different exposition.
    return Config(agent=o, exporters=ExportersOptions(timeout=20.0),
                  enabled={e.name: True for e in vocabulary.EXPORTERS},
                  parts={WorkersOptions: WorkersOptions(per_worker=True),
                         FuseOptions: FuseOptions(probe_timeout=10.0),
                         GpuOptions: GpuOptions(nvml=False, simulated=True, dcgm_url=dcgm_url,
                                                dcgm_interval=2.0)})


def _part(agent: Agent, name: str) -> Any:
    return next(p for p in agent.parts.parts if p.name == name)


def _send(handler: ingest.Ingest, batch, accepted: bool = True) -> None:
    for peer_pid, data in batch:
        if handler.handle(data, handler.source_of(peer_pid, 1000), checked=True) != accepted:
            raise AssertionError("the golden scenario's report was %s: %r" % (
                "rejected" if accepted else "accepted", data[:200]))


def drive(agent: Agent, later: Any = lambda: None) -> None:
    """Feed the reports and drive every part, in a fixed order; ``later()`` moves the
    node's counters on, between the two collections."""
    gpu = _part(agent, "gpu")
    for s in gpu.samplers:  # polled here, not in threads of their own
        s.ensure_running = lambda stopping: None
    gpu.dcgm.ensure_running = lambda stopping: None
    states = _part(agent, "loaderstate")
    states.start = lambda: None  # its sampler thread: driven here, a round at each step
    now = [1000.0]
    agent.host.clock = lambda: now[0]  # exporters' rates over exactly 2 s

    def poll_gpu():
        for s in gpu.samplers:
            s.poll()
        gpu.dcgm.poll()

    # On a whole second: the detector bins batches by the clock's seconds
    # (correlate/waitbins.py), so where "now" falls within one must not vary by run.
    base = time.monotonic_ns() // S * S
    first, second, bad = reports(base)
    handler = ingest.Ingest(None, agent.apply, agent.source_of, stats=agent.stats)
    try:
        _send(handler, first)
        poll_gpu()                  # the simulated GPU appears, samples the first half
        agent.runner.collect_now()  # ... and is mapped to its rank
        _send(handler, second)
        _send(handler, bad[:2])     # accepted; their io and cuda parts are not
        _send(handler, bad[2:], accepted=False)
        poll_gpu()                  # the second half, recorded for the rank too
        states.sample_once()        # the loader tasks' first reading ...
        later()                     # the node's counters move over the next 2 s
        now[0] += node.LATER_S
        # ... and 2 s of their states (the tree's schedstat stands still): a round looks
        # at every task
        states.sample_once()
        agent.runner.collect_now()
    finally:
        handler.selector.close()
        handler.hangups.close()
        os.close(handler.wake_r)
        os.close(handler.wake_w)
    # The parts' windows end "now": freeze it one second after the reports were made, so
    # that how long the steps above took (a loaded machine) cannot move a window's edge
    # and with it the scores (the correlator compares the stall with the quiet before it).
    frozen = base + 1_000_000_000
    with mock.patch("time.monotonic_ns", lambda: frozen), \
            mock.patch("time.monotonic", lambda: frozen / 1e9):
        agent.loader.tick()
        _part(agent, "shards").tick()
        agent.correlator.refresh()
        agent.correlator.detect(frozen / 1e9)  # the stall, found and analysed at once


def emitters(agent: Agent) -> dict[str, set[str]]:
    """{part name: names of the families it emits}; the exporters' through the runner."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    theirs = set()
    for slot in agent.runner.slots:
        for fam in slot.families:
            theirs.add(id(fam))
            out[slot.name].add(fam.name)
    for p in agent.parts.parts:
        if not p.isolated:
            out[p.name].update(f.name for f in p.collect() if id(f) not in theirs)
    out["agent"].update(f.name for f in agent.parts.collect())
    return dict(out)


def failures(agent: Agent) -> list[str]:
    out = ["exporter %s: %s" % (s["exporter"], s["error"] or "unavailable: %s" % s["unavailable_reason"])
           for s in agent.runner.status() if not s["success"]]
    out += ["part %s failed to collect (see its log line above)" % name
            for name, n in sorted(agent.parts.errors.items()) if n]
    if agent.correlator.failures:
        out.append("the correlator failed %d time(s)" % agent.correlator.failures)
    return out


class Collected:
    """Families collected once, as a registry (what generate_latest takes)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _run(tree: str) -> Run:
    """The agent over the node's tree (written), its counters moved to node.LATER
    between the two collections."""
    why = _mount_tmpfs(os.path.join(tree, "root", "dev", "shm"))
    mounted = why is None
    saved = (psutil.PROCFS_PATH, getattr(psutil._pslinux, "PAGESIZE", None),
             getattr(psutil._pslinux, "CLOCK_TICKS", None))
    dcgm = DcgmServer(fixture("dcgm-exporter-k8s.txt"))
    agent = None
    try:
        # RSS and CPU seconds as a 4 KiB-page, 100 Hz kernel reports them, on any host.
        psutil._pslinux.PAGESIZE, psutil._pslinux.CLOCK_TICKS = 4096, 100
        agent = Agent(_config(tree, dcgm.url))
        spy = RecordSpy(agent.samples)
        drive(agent, lambda: nodetree.rewrite(node.LATER, tree))
        families = list(agent.registry.collect())
        text = generate_latest(Collected(families)).decode()
        gpu = _part(agent, "gpu")
        scopes = [r.key for r in agent.host.ranks()] + ["node"] + [("gpu", u) for u in sorted(gpu.gpus())]
        found = list(agent.correlator.results.values())
        return Run(exposition=text, families=families, exact=mounted, inexact_why=why, recorded=dict(spy.by),
                   last=dict(spy.last),
                   stored={sc: agent.samples.signals(sc) for sc in scopes},
                   emitted_by=emitters(agent), failures=failures(agent),
                   notes={k: list(v) for k, v in agent.host.notes.items()},
                   diagnosis=found[0].diagnosis if found else None)
    finally:
        if agent is not None:
            agent.stopping.set()
        dcgm.close()
        psutil.PROCFS_PATH = saved[0]
        if saved[1] is not None:
            psutil._pslinux.PAGESIZE = saved[1]
        if saved[2] is not None:
            psutil._pslinux.CLOCK_TICKS = saved[2]
        if mounted:
            subprocess.run(["umount", os.path.join(tree, "root", "dev", "shm")], check=True)


_RUN: list[Run] = []


def golden_run() -> Run:
    """The run (once per session: both test modules read the same one)."""
    if not _RUN:
        tmp = tempfile.mkdtemp(prefix="stallscope-golden-")
        try:
            tree = os.path.join(tmp, "fixtures")
            nodetree.write(node.NODE, tree)
            _RUN.append(_run(tree))
        finally:
            shutil.rmtree(tmp)
    return _RUN[0]


# -- what is compared -------------------------------------------------------------------
def masked(exposition: str) -> str:
    """The exposition with the values of MASKED_* samples replaced by MASK, and HEADER."""
    out = []
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            head, _, _value = line.rpartition(" ")  # no timestamps: the value is last
            name = head.partition("{")[0]
            if name.endswith(MASKED_SUFFIXES) or name in MASKED_NAMES:
                line = "%s %s" % (head, MASK)
        out.append(line)
    return HEADER + "\n".join(out) + "\n"


def scope_kind(scope: Any) -> str:
    if scope == "node":
        return "node"
    if isinstance(scope, tuple) and scope and scope[0] == "gpu":
        return "gpu"
    return "rank"


def signals_table(run: Run) -> str:
    """One line per recorded signal and kind of scope: which parts recorded it, and the
    value recorded last (of a rate, over the 2 s between the two collections, in which
    the node's counters moved: tests/golden/fixtures/node.py LATER)."""
    rows = collections.defaultdict(set)
    last = {}
    for (scope, sig), parts in run.recorded.items():
        rows[(sig, scope_kind(scope))] |= parts
        last[(sig, scope_kind(scope))] = run.last.get((scope, sig))
    def shown(sig: str, value: float | None) -> str:
        if value is None:
            return "-"
        return MASK if sig in MASKED_SIGNALS else "%.6g" % value
    lines = ["%-29s %-5s %-11s %s" % (sig, kind, ",".join(sorted(parts)), shown(sig, last[(sig, kind)]))
             for (sig, kind), parts in sorted(rows.items())]
    return ("# Signals the golden run records: signal, kind of scope, the parts that recorded it,\n"
            "# the value recorded last. Rewrite with: pytest tests/golden --update\n"
            + "\n".join(lines) + "\n")
