"""Memory with a ceiling (issue 14): every per-rank history is a fixed-capacity ring sized
from --max-ranks and --timeline-seconds, so however long or fast ranks report, what the
agent holds for them stays at the figure it prints at start."""
import dataclasses
import os
import time

import numpy as np
import pytest

from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.agent.table.budget import Budget
from stallscope.host.report import BatchColumns
from stallscope.host.rings import Ring
from tests.helpers.correlate import report


def test_a_ring_keeps_the_newest_rows_in_order():
    r = Ring(5, 3)
    for k in range(4):
        r.extend(np.array([[3 * k + i, 0, 0] for i in range(3)], np.int64))
    assert r.rows()[:, 0].tolist() == [7, 8, 9, 10, 11] and len(r) == 5
    r.extend(np.array([[100 + i, 0, 0] for i in range(9)], np.int64))  # more than it holds
    assert r.rows()[:, 0].tolist() == [104, 105, 106, 107, 108]
    assert r.since(106)[:, 0].tolist() == [106, 107, 108]



def test_a_point_appended_one_at_a_time_is_kept_as_an_extended_one():
    from stallscope.host.rings import PointRing

    one, many = PointRing(4), PointRing(4)
    for k in range(7):  # wraps: the oldest go as from extend()
        one.append(10 * k, k / 2)
    many.extend(np.arange(0, 70, 10, dtype=np.int64), np.arange(7) / 2)
    assert len(one) == 4
    for a, b in zip(one.since(0), many.since(0)):
        assert a.tolist() == b.tolist()
    assert one.since(0)[0].tolist() == [30, 40, 50, 60] and one.since(45)[1].tolist() == [2.5, 3.0]

def test_a_window_copies_the_window_not_the_ring():
    # The correlator cuts 1-300 s windows out of 900 s rings several times a second; a
    # copy of the whole ring each time (then cut) churned ~150 KiB blocks through the
    # heap, where they left it fragmented (issue 14's soak: glibc's free bytes in the
    # heap rose 2 -> 10 MiB while its in-use bytes stayed at 20 MiB).
    import tracemalloc

    from stallscope.host.rings import PointRing

    ring, points = Ring(100_000, 4), PointRing(100_000)
    t = np.arange(150_000, dtype=np.int64)  # wrapped: the window spans both segments
    ring.extend(np.stack([t, t, t, t], 1))
    points.extend(t, t / 2.0)
    tracemalloc.start()
    try:
        rows = ring.since(149_000)
        times, values = points.since(148_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows[:, 0].tolist() == list(range(149_000, 150_000))
    assert times.tolist() == list(range(148_000, 150_000)) and values[0] == 74_000.0
    assert peak < 200_000, peak  # the rings are 3.2 MB and 1.6 MB


def test_history_stays_within_the_printed_ceiling(tmp_path):
    opts = AgentOptions(socket=str(tmp_path / "s.sock"), max_ranks=4, timeline_seconds=60)
    agent = Agent(Config(agent=opts, enabled={"gpu": False}))
    budget = Budget(4, 60)
    assert "memory ceiling" in budget.describe()
    now = time.monotonic_ns()
    for rank in range(4):
        for chunk in range(20):  # 20,000 batches a rank: far more than 60 s x 20/s
            events = [(now - (20000 - (chunk * 1000 + i)) * 10**6, 10**5, 10**6) for i in range(1000)]
            agent.apply(report("mem", rank, "p", events))
            agent.samples.record_many(("mem", rank), "batch_load_seconds",
                                      [e[0] for e in events], [0.01] * len(events))
    for r in agent.table.snapshot():
        assert len(r.timeline) == budget.events == 1200  # capped, the newest kept
        assert r.timeline.rows()[-1, 0] == now - 10**6
        assert r.wait.count == 20000  # the histograms still count every batch
    held = sum(r.timeline.nbytes for r in agent.table.snapshot()) + agent.samples.nbytes()
    assert held <= budget.history_bytes()


def test_a_workers_report_before_its_trainers_first_is_held_then_applied(tmp_path):
    from stallscope.agent.table.held import HELD

    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock")), enabled={"gpu": False}))
    now = time.monotonic_ns()
    worker = dataclasses.replace(report("held", 0, "p", [(now - 10**9, 3 * 10**8, 4 * 10**8)]), role="worker")
    assert agent.apply(worker) is HELD and len(agent.held) == 1
    agent.apply(report("held", 0, "p", [(now, 10**6, 10**8)]))
    assert len(agent.held) == 0 and agent.stats.accepted == 1  # the held one, applied
    assert agent.loader.states[("ns", "p", "held", 0)].hist.count == 1
    agent.apply(dataclasses.replace(report("held", 1, "p", []), role="worker"))
    agent.held.expire(agent._expire_held, now=time.monotonic() + 60)  # its trainer never came
    assert agent.stats.rejected["unknown_rank"] == 1 and len(agent.held) == 0


def test_held_reports_survive_the_jobs_thread_expiring_them_meanwhile():
    # The ingest thread takes a rank's held reports while the jobs thread expires old ones:
    # a 1M-message fuzz run caught "deque mutated during iteration" (an internal_error
    # reject) before Held had a lock.
    import threading

    from stallscope.agent.table.held import Held

    held = Held(hold_s=0.0005, max_held=4096)
    errors, stop = [], threading.Event()
    worker = dataclasses.replace(report("j", 0, "p", []), role="worker")

    def expire():
        while not stop.is_set():
            held.expire(lambda: None)

    t = threading.Thread(target=expire)
    t.start()
    try:
        for i in range(20000):
            held.hold(("j", i % 7), worker, None)
            try:
                held.take(("j", (i + 3) % 7))
            except RuntimeError as e:
                errors.append(e)
                break
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_samples_of_ranks_that_come_and_go_do_not_stay(tmp_path):
    # Ranks of short jobs come and go under the simulated GPU: each leaves its GPU's
    # ("gpu", uuid) scope in the sample store, which nobody forgets (only the rank's own
    # scope is dropped with it), and an exporter that read the rank list before a rank
    # expired records into its scope again afterwards. 40 such ranks kept 40 rings for
    # the agent's life (~150 KiB each at the default timeline); expiry keeps nothing
    # older than the timeline's horizon.
    from stallscope.exporters import ExportersOptions
    from stallscope.exporters.gpu.options import GpuOptions

    others = {n: False for n in ("cfs", "psi", "shm", "fuse", "workers", "disk", "sched")}
    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock"), timeline_seconds=60),
                         exporters=ExportersOptions(interval=0.2), enabled=others,
                         parts={GpuOptions: GpuOptions(simulated=True, nvml=False)}))
    gpu = next(e for e in agent.node_exporters if e.name == "gpu")
    sampler = gpu.samplers[0]
    t0 = time.monotonic_ns()
    for rank in range(40):
        now = time.monotonic_ns()
        agent.apply(report("churn%d" % rank, rank, "p%d" % rank,
                           [(now - (20 - i) * 10**8, 10**6, 10**8) for i in range(20)]))
        sampler.poll()  # the simulated GPU's samples: ("gpu", uuid) and, mapped, the rank's
        gpu.refresh(agent.table.snapshot())
        sampler.poll()
        later = time.monotonic() + 3600  # its process gone (found so, then past the grace)
        gone = agent.table.expire(now=later) + agent.table.expire(now=later + 3600)
        agent.parts.forget(gone)
    gpu.refresh(agent.table.snapshot())
    agent.samples.record(gone[0], "workers_alive", 8.0)  # a collection that began before
    assert not agent.table.snapshot()
    scopes = {k[0] for k in agent.samples.data}
    assert sum(1 for s in scopes if s[0] == "gpu") == 40 and gone[0] in scopes  # what stayed
    assert agent.samples.expire(now_ns=time.monotonic_ns() + 60 * 10**9 + 1) == 41
    assert not agent.samples.data
    # a live scope keeps its ring: expiry goes by the newest point, not by age of the first
    agent.samples.record("node", "psi_cpu_some_ratio", 0.5, t0)
    agent.samples.record("node", "psi_cpu_some_ratio", 0.5)
    assert agent.samples.expire() == 0 and len(agent.samples.data) == 1


def test_notes_naming_pods_that_come_and_go_stay_bounded(tmp_path):
    # The cfs exporter notes each pod cgroup without CFS counters by its path: one note
    # per pod for the agent's life, in the notes and in what was said.
    from stallscope.agent.host import NOTES_KEPT

    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock")), enabled={"gpu": False}))
    host = agent.host
    for pod in range(5000):
        host.note("cfs", "no CFS counters in /sys/fs/cgroup/kubepods/pod%d/cpu.stat" % pod)
    assert len(host.notes["cfs"]) == NOTES_KEPT and host.notes["cfs"][-1].endswith("pod4999/cpu.stat")
    assert len(host._noted) <= 32 * NOTES_KEPT
    host.note("shm", "no /dev/shm under --path.rootfs /x")
    host.note("shm", "no /dev/shm under --path.rootfs /x")  # said once
    assert host.notes["shm"] == ["no /dev/shm under --path.rootfs /x"]


def test_held_reports_keep_only_what_is_applied_and_each_sender_has_its_share():
    # Issue 33: held reports were kept whole (their parsed raw message too), unbounded in
    # bytes, so one sender could fill the agent's memory and every other sender's room.
    from types import SimpleNamespace

    from stallscope.agent.table.held import ENTRY_BYTES, Held, Slim

    worker = dataclasses.replace(report("h", 0, "p", []), role="worker")
    padded = dataclasses.replace(worker, raw={"pad": [{}] * 20000, "io": {"reads": [[1, 2, 3, 0]]}})
    cost = Slim(padded).nbytes
    assert ENTRY_BYTES < cost < ENTRY_BYTES + 100  # the pad is not kept, the io is
    # a held report's batch columns are counted: three int64 columns of 10 events
    with_events = dataclasses.replace(worker, events=BatchColumns.of([[10**9, 10, 20]] * 10))
    assert Slim(with_events).nbytes == Slim(worker).nbytes + 10 * 3 * 8
    held = Held(max_bytes=64 * ENTRY_BYTES, max_bytes_per_domain=8 * cost)
    attacker, trainer = SimpleNamespace(domain=("pod", "a")), SimpleNamespace(domain=("pod", "t"))
    taken = sum(held.hold(("ns", "p", "h", r), padded, attacker) for r in range(100))
    assert taken == 8 and held.by_domain[attacker.domain] == 8 * cost  # its share, no more
    assert held.hold(("ns", "q", "h", 0), worker, trainer)  # the trainer's worker still is
    (msg, source), = held.take(("ns", "p", "h", 3))
    assert source is attacker and msg.raw == {"io": {"reads": [[1, 2, 3, 0]]}}  # no pad
    assert msg.ident == worker.ident and msg.role == "worker"
    assert held.by_domain[attacker.domain] == 7 * cost
    held.expire(lambda: None, now=time.monotonic() + 60)
    assert held.nbytes == 0 and not held.by_domain and len(held) == 0
    # bounded in total too: 8 senders' shares fill it, the ninth is refused
    full = Held(max_bytes=64 * ENTRY_BYTES, max_bytes_per_domain=8 * ENTRY_BYTES)
    for d in range(9):
        src = SimpleNamespace(domain=("pod", str(d)))
        assert sum(full.hold(("ns", "p", "h", r), worker, src) for r in range(8)) == (8 if d < 8 else 0)


@pytest.mark.slow  # ~10 s for CI's 2,000 pods; STALLSCOPE_CHURN_PODS=10000 for the figure
def test_ten_thousand_churned_pods_leave_a_bounded_number_of_series_and_scopes(tmp_path):
    # Issue 33: each departed pod kept its 5 worker-exit series for 900 s, not bounded by
    # --max-ranks (10,000 short-lived pods: ~47,000 series), and each departed rank's
    # scopes stayed in the sample store as long.
    from stallscope.exporters.worker_deaths import REASONS
    from stallscope.vocabulary.agent import DEPARTED_PODS_KEPT

    only = {n: n == "workers" for n in ("cfs", "psi", "shm", "fuse", "workers", "disk", "sched", "gpu")}
    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock"), max_ranks=4,
                                            timeline_seconds=60), enabled=only))
    workers = next(e for e in agent.node_exporters if e.name == "workers")
    # the bound does not depend on the count once it is well past it (256 departed pods,
    # 2 x max-ranks + 64 scopes): CI runs 2,000 (~10 s), the 10,000 take ~45 s
    pods = int(os.environ.get("STALLSCOPE_CHURN_PODS", "2000"))
    for pod in range(pods):
        now = time.monotonic_ns()
        agent.apply(report("churn", 0, "p%d" % pod, [(now - 10**8, 10**6, 10**8)]))
        agent.samples.record(("gpu", "sim-%d" % pod), "gpu_busy_ratio", 0.5)  # its GPU's scope
        workers.collect()
        later = time.monotonic() + 3600  # gone: found so, then past the grace
        agent.parts.forget(agent.table.expire(now=later) + agent.table.expire(now=later + 3600))
    series = [s for f in workers.collect() for s in f.samples
              if s.name == "stallscope_loader_worker_exits_total"]
    assert len(series) == DEPARTED_PODS_KEPT * len(REASONS)  # was pods x 5
    kept = {s.labels["pod"] for s in series}
    assert kept == {"p%d" % p for p in range(pods - DEPARTED_PODS_KEPT, pods)}  # the newest
    assert len(agent.samples.scopes) <= agent.budget.max_scopes
    assert ("gpu", "sim-%d" % (pods - 1)) in agent.samples.scopes  # the newest are kept
    assert agent.samples.nbytes() <= agent.budget.history_bytes()
