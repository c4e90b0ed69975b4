"""The simulated GPU over hook events fed as the gpu exporter feeds it (every report that
the real rank table accepts): busy exactly between a batch's arrival and the loop's next
next() call, final only up to the newest call."""
import random

import pytest

from stallscope.agent.host import AgentHost
from stallscope.agent.table.samples import SampleStore
from stallscope.agent.table.state import RankTable
from stallscope.exporters.gpu.sim import SimulatedSource, sim_uuid
from stallscope.exporters.gpu.source import Sampler
from stallscope.host.report import HookReport

MS = 1_000_000
IDENT = {"job": "j", "rank": 0, "local_rank": 0, "world_size": 1, "pod": "p",
         "namespace": "ns", "node": "n"}


def msg(events, rank=0):
    return HookReport.of({"id": dict(IDENT, rank=rank), "pid": 1, "role": "main", "mono_ns": 0,
                          "wall_ns": 0, "dropped_total": 0, "events": events, "loader": None, "raw": {}})


def source(table, **kw):
    return SimulatedSource(AgentHost(table, SampleStore(60)), **kw)


def report(table, src, m):
    """A report reaches the table, then the gpu exporter, which feeds the simulation."""
    rank = table.apply(m)
    src.feed(rank.key, m.events)


def loop(t0, phases):
    """phases: [(wait_ns, compute_ns)] of one iterator from t0 → hook events and the
    loop's compute intervals, the way watch.py and channel.py produce them."""
    events, busy, t, prev_end = [], [], t0, None
    for wait, compute in phases:
        end = t + wait
        events.append([end, wait, end - prev_end if prev_end is not None else wait])
        busy.append((end, end + compute))
        prev_end, t = end, end + compute
    return events, busy


def overlap(intervals, a, b):
    return sum(max(0, min(e, b) - max(s, a)) for s, e in intervals)


def check_bins(samples, busy, period):
    for t, p, ratio in samples:
        assert p == period
        assert ratio == pytest.approx(overlap(busy, t - p, t) / p, abs=1e-9)


def test_busy_follows_compute_and_waits_are_idle():
    rng = random.Random(7)
    phases = [(rng.randrange(0, 40 * MS), rng.randrange(1, 60 * MS)) for _ in range(200)]
    events, busy = loop(10**12, phases)
    table = RankTable(procfs_root="/nonexistent")
    src = source(table, period_s=0.1)
    out = []
    for i in range(0, len(events), 37):  # arriving in flushes, as from the hook
        report(table, src, msg(events[i:i + 37]))
        (gpu,) = src.gpus()
        out += src.read(gpu)
    assert gpu.uuid == sim_uuid(("ns", "p", "j", 0)) and gpu.uuid.startswith("SIM-")
    check_bins(out, busy, 100 * MS)
    first_call = events[0][0] - events[0][1]
    last_arrival = events[-1][0]
    assert out[0][0] == first_call + 100 * MS  # from the first next() call ...
    assert out[-1][0] <= last_arrival < out[-1][0] + 100 * MS  # ... to the newest batch
    ends = [t for t, _, _ in out]
    assert ends == sorted(set(ends))
    total = sum(r * p for _, p, r in out)
    assert total == pytest.approx(overlap(busy, first_call, out[-1][0]), rel=1e-9)


def test_a_long_stall_is_filled_in_when_the_batch_arrives():
    table = RankTable(procfs_root="/nonexistent")
    src = source(table, period_s=0.1)
    t0 = 10**12
    events, busy = loop(t0, [(1 * MS, 50 * MS)] * 10)
    report(table, src, msg(events))
    (gpu,) = src.gpus()
    before = src.read(gpu)
    assert src.read(gpu) == []  # nothing new: the loop is computing or blocked
    stall_end = busy[-1][1] + 3000 * MS  # a 3 s wait (a dead mount coming back)
    report(table, src, msg([[stall_end, 3000 * MS, stall_end - events[-1][0]]]))
    after = src.read(gpu)
    assert len(after) >= 30 and all(r == 0.0 for _, _, r in after[2:])
    check_bins(before + after, busy, 100 * MS)


def test_epochs_and_two_ranks_get_their_own_gpus():
    table = RankTable(procfs_root="/nonexistent")
    src = source(table, period_s=0.05)
    e1, b1 = loop(10**12, [(2 * MS, 30 * MS)] * 20)
    e2, b2 = loop(b1[-1][1] + 500 * MS, [(5 * MS, 30 * MS)] * 20)  # a new iterator
    report(table, src, msg(e1 + e2, rank=0))
    report(table, src, msg(e1, rank=1))
    gpus = src.gpus()
    assert [g.index for g in gpus] == [0, 1] and len({g.uuid for g in gpus}) == 2
    out = src.read(gpus[0])
    # An iterator's last compute and the gap between epochs are unknown: idle.
    check_bins(out, b1[:-1] + b2, 50 * MS)


def test_sampler_drives_the_simulation_like_nvml():
    table = RankTable(procfs_root="/nonexistent")
    events, busy = loop(10**12, [(10 * MS, 30 * MS)] * 50)
    src = source(table)
    report(table, src, msg(events))
    got = []
    s = Sampler(src, on_samples=lambda gpu, samples: got.extend(samples))
    s.poll()
    (gpu, status, ratio, busy_s, sampled_s, pids), = s.snapshot()
    assert gpu.source == "simulated" and status == "ok" and pids == {}
    assert busy_s / sampled_s == pytest.approx(0.75, abs=0.02) and got
    table.ranks.clear()  # the rank expired: its simulated GPU goes with it
    s.poll()
    assert s.snapshot() == []


def _union(rows):
    """The union of [start, end] rows, merged one row at a time (the reference)."""
    out = []
    for a, b in sorted(map(tuple, rows)):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def test_busy_stretches_merge_into_their_union_whether_apart_or_overlapping():
    import numpy as np

    from stallscope.exporters.gpu.sim import _busy_until, _merge

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(0, 40)
        starts = sorted(rng.sample(range(0, 10_000), n))
        if rng.random() < 0.5:  # one loader: sorted and apart (the fast path)
            rows = [[s, s + rng.randint(1, 5)] for s in starts[::2]]
        else:  # two loaders interleaving: overlapping, touching, out of order
            rows = [[s, s + rng.randint(0, 600)] for s in starts]
            rng.shuffle(rows)
        iv = np.array(rows, np.int64).reshape(-1, 2)
        merged = _merge(iv)
        assert merged.tolist() == _union(rows)
        t = np.array(sorted(rng.sample(range(-10, 11_000), 30)), np.int64)
        want = [sum(max(0, min(b, x) - a) for a, b in _union(rows)) for x in t.tolist()]
        assert _busy_until(merged, t).tolist() == want
