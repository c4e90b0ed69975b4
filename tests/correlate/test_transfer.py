"""transfer_cost (correlate/transfer.py): the loop's wait split by the hook into waiting
for a ready batch and transfer, scored by the transfer's share of the steady wait."""
import numpy as np
import pytest

from stallscope.correlate import consumer, diagnosis
from stallscope.correlate.facts import RankFacts
from stallscope.correlate.trace import RankTrace, Series
from stallscope.lab import synth
from tests.helpers.correlate import trace_of, wire


def run(workers, load, compute, transfer, n=400, seed=0, load_signal=False):
    rng = np.random.default_rng(seed)
    j = synth.jitter(rng, 0.05)
    events, _ = synth.simulate(n, workers, lambda k, t: j(load), lambda k, t: j(compute),
                               transfer=None if transfer is None else (lambda k, t: j(transfer)))
    signals = {}
    if load_signal:  # the workers' batch load time, one sample a batch (loader part)
        signals["batch_load_seconds"] = [[int(e[0]), j(load)] for e in events]
    return trace_of(events, workers=workers, signals=signals)


def causes(d):
    return {c["cause"]: c for c in d["causes"]}


def test_a_wait_that_is_mostly_transfer_is_named_transfer_cost():
    # Workers keep far ahead (20 ms a batch for 2 of them against 150 ms of compute), but
    # getting each batch into the loop takes 20 ms: ~12 % of each step waits, all of it
    # transfer.
    d = wire(diagnosis.analyse(run(workers=2, load=0.02, compute=0.15, transfer=0.02)))
    assert d["verdict"] == "input_bound"
    assert d["causes"][0]["cause"] == "transfer_cost", d["causes"]
    top = d["causes"][0]
    assert top["score"] > 0.95
    ev = {e["signal"]: e for e in top["evidence"]}
    assert ev["transfer_wait_ratio"]["during_stalls"] > 0.95
    assert ev["transfer_ratio"]["during_stalls"] == pytest.approx(0.02 / 0.17, rel=0.1)
    assert ev["ready_wait_ratio"]["during_stalls"] < 0.005
    assert ev["transfer_seconds_per_batch"]["during_stalls"] == pytest.approx(0.02, rel=0.1)
    assert causes(d)["unexplained"]["score"] < 0.05
    assert "transfer_cost" not in d["not_evaluated"]
    # the loader keeps up: the verdict's reason says so first, with the handoff's share
    # of the step, which the diagnosis carries for both diagnose paths (issue 30, item 5)
    assert d["rule"] == "handoff" and d["reason"].startswith("The loader keeps up"), d["reason"]
    assert d["handoff_ratio"] == pytest.approx(0.02 / 0.17, rel=0.1)
    assert "%.1f%% of the step" % (100 * d["handoff_ratio"]) in d["reason"]


def test_slow_workers_stay_too_few_workers_with_a_small_transfer():
    # 2 workers at 480 ms a batch against 150 ms of compute: ~90 ms of ready wait a batch,
    # 2 ms of transfer.
    d = wire(diagnosis.analyse(run(workers=2, load=0.48, compute=0.15, transfer=0.002, load_signal=True)))
    assert d["verdict"] == "input_bound"
    assert d["causes"][0]["cause"] == "too_few_workers", d["causes"]
    moved = causes(d)["transfer_cost"]
    assert moved["score"] == pytest.approx(0.002 / 0.092, abs=0.02)
    assert d["rule"] == "over_line" and d["handoff_ratio"] < 0.02  # the workers are what is slow


def test_workers_short_of_cpu_stretch_the_transfer_and_cpu_throttle_wins():
    """Throttled workers hand their tensors over slowly (the lab's cpu-throttle run: 91 %
    of the wait measured as transfer): the transfer is discounted by the cpu_throttle
    score, and the quota is named."""
    tr = run(workers=2, load=0.02, compute=0.15, transfer=0.1)
    span = (int(tr.t_end[0] - tr.interval[0]), int(tr.t_end[-1]))
    tr.signals["cfs_throttled_ratio"] = Series.from_points(synth.sampled(lambda t: 0.9, *span))
    tr.signals["workers_cpu_ratio"] = Series.from_points(synth.sampled(lambda t: 0.2, *span))
    d = wire(diagnosis.analyse(tr))
    got = causes(d)
    assert d["causes"][0]["cause"] == "cpu_throttle", d["causes"]
    assert got["transfer_cost"]["score"] == pytest.approx(
        got["transfer_cost"]["evidence"][0]["during_stalls"] * (1 - got["cpu_throttle"]["score"]), abs=1e-3)
    assert "short of CPU" in got["transfer_cost"]["summary"]
    # workers on their cores contradict the shortage: the transfer is the loop's own
    tr.signals["workers_cpu_ratio"] = Series.from_points(synth.sampled(lambda t: 1.8, *span))
    d = wire(diagnosis.analyse(tr))
    assert d["causes"][0]["cause"] == "transfer_cost", d["causes"]


def test_half_and_half_scores_half():
    # A batch every 170 ms from 2 workers; the loop needs 150 ms of compute and 10 ms of
    # transfer: it waits 10 ms for a ready batch, then 10 ms for its transfer.
    d = wire(diagnosis.analyse(run(workers=2, load=0.34, compute=0.15, transfer=0.01)))
    share = causes(d)["transfer_cost"]["score"]
    assert 0.35 < share < 0.65, share


def test_without_the_split_it_is_not_evaluated():
    d = wire(diagnosis.analyse(run(workers=2, load=0.48, compute=0.15, transfer=None)))
    assert d["verdict"] == "input_bound"
    assert "transfer_cost" in d["not_evaluated"]
    assert "transfer_cost" not in causes(d)


def test_the_split_survives_the_timeline_json_and_a_stall_segment():
    events = [(10**9 * k, 10**7, 10**8, 4 * 10**6) for k in range(1, 51)]
    body = synth.body(events, workers=2)
    assert body["batches"][0]["ready_wait_ns"] == 4 * 10**6
    tr = RankTrace.from_timeline(body)
    assert tr.ready.tolist() == [4 * 10**6] * 50
    assert tr.since(25 * 10**9).ready.tolist() == [4 * 10**6] * 25
    old = synth.body([e[:3] for e in events], workers=2)
    assert "ready_wait_ns" not in old["batches"][0]
    assert RankTrace.from_timeline(old).ready.tolist() == [-1] * 50
    arr = np.array(events, np.int64)
    assert RankTrace.from_events({}, None, arr).ready.tolist() == [4 * 10**6] * 50
    assert RankTrace.from_events({}, None, arr[:, :3]).ready.tolist() == [-1] * 50


def test_the_report_says_first_that_the_loader_keeps_up():
    """The report's first line (diagnose, either path: the handoff share comes from the
    agent's diagnosis or Prometheus's counters) says it when the handoff alone puts the
    rank over the line, and not when the ready-wait does."""
    from stallscope.diagnose import render
    from tests.helpers.diagnose import report

    first = render.render_text(report(data_wait_ratio=0.035, handoff_ratio=0.034)).splitlines()[0]
    assert first.startswith("INPUT-BOUND (the loader keeps up; the per-batch handoff costs 3.4% "
                            "of the step)"), first
    for doc in (report(data_wait_ratio=0.12, handoff_ratio=0.034), report(data_wait_ratio=0.035),
                report(verdict="healthy", data_wait_ratio=0.015, handoff_ratio=0.014)):
        assert "keeps up" not in render.render_text(doc).splitlines()[0]


def test_a_throttled_consumer_is_told_from_a_throttled_loader():
    """Issue 30: the training process in a CFS quota, its workers idle with batches ready:
    the throttling is named as before, and its sentence says the consumer was held back
    and the loader has headroom, from what the sampler measured (the main thread waiting
    for a CPU, the workers not). Throttled workers stretch the handoff the same way, so
    the split alone says nothing (the test above)."""
    tr = run(workers=4, load=0.02, compute=0.15, transfer=0.1)
    span = (int(tr.t_end[0] - tr.interval[0]), int(tr.t_end[-1]))
    for name, v in (("cfs_throttled_ratio", 0.9), ("loader_main_cpu_wait_ratio", 0.45),
                    ("loader_workers_cpu_wait_ratio", 0.01), ("loader_workers_idle_ratio", 0.97)):
        tr.signals[name] = Series.from_points(synth.sampled(lambda t, v=v: v, *span))
    d = wire(diagnosis.analyse(tr))
    top = d["causes"][0]
    assert top["cause"] == "cpu_throttle", d["causes"]
    assert "the training process, the consumer" in top["summary"], top["summary"]
    assert "workers were idle 97%" in top["summary"] and "main thread waited for a CPU 45%" in top["summary"]
    assert "Raise the trainer container's CPU limit" in top["summary"]
    assert "the loader has headroom" in top["summary"]
    # the workers waited for a CPU as much: the loader is held back too, nothing is placed
    tr.signals["loader_workers_cpu_wait_ratio"] = Series.from_points(synth.sampled(lambda t: 0.4, *span))
    top = wire(diagnosis.analyse(tr))["causes"][0]
    assert top["cause"] == "cpu_throttle" and "consumer" not in top["summary"], top


def test_a_consumer_throttled_all_along_leads_over_the_handoff_it_stretches():
    """Issue 30: a quota that throttles all along scores low by co-occurrence (it is on
    outside the stalls too), and the stretched handoff then led as transfer_cost (the lab,
    before: transfer_cost 0.85, cpu_throttle 0.07). With the sampler's word that the
    consumer, not its workers, waited for a CPU, the CPU cause takes the handoff's share
    of the wait times the consumer's wait beyond its workers' (consumer.held_share)."""
    # the handoff stretched in episodes (the quota ran out mid-handoff), batches always ready
    events, _ = synth.simulate(400, 4, lambda k, t: 0.02, lambda k, t: 0.15,
                               transfer=lambda k, t: 0.06 if (t % 6) < 2 else 0.0002)
    tr = trace_of(events, workers=4)
    span = (int(tr.t_end[0] - tr.interval[0]), int(tr.t_end[-1]))

    def signal(name, v, spread=0.0):
        noise = np.random.default_rng(len(name))
        tr.signals[name] = Series.from_points(synth.sampled(lambda t: v + spread * noise.random(), *span))
    # throttled every period, stalls or not, as the lab's run measured (0.56-0.62 s/s)
    signal("cfs_throttled_ratio", 0.93, 0.07)
    signal("cfs_throttled_seconds_rate", 0.55, 0.1)
    quota = RankFacts(quota_measured=True, quota_cores=0.5)
    before = causes(wire(diagnosis.analyse(tr, facts=quota)))
    assert max(before, key=lambda c: before[c]["score"]) == "transfer_cost", before
    signal("loader_main_cpu_wait_ratio", 0.15)
    signal("loader_main_on_cpu_ratio", 0.05)
    signal("loader_workers_cpu_wait_ratio", 0.006)
    signal("loader_workers_idle_ratio", 0.99)
    d = wire(diagnosis.analyse(tr, facts=quota))
    share = before["transfer_cost"]["evidence"][0]["value"]   # the handoff's share of the wait
    # the time budget (budget.py): taking a batch over, the training thread was on a CPU
    # 0.05 and runnable without one 0.15 of its time: the handoff splits 1 : 3
    held = 0.15 / (0.15 + 0.05)
    top, second = d["causes"][0], causes(d)["transfer_cost"]
    assert top["cause"] == "cpu_throttle", d["causes"]
    assert top["score"] == pytest.approx(share * held, abs=0.01)
    assert second["score"] == pytest.approx(share * (1 - held), abs=0.01)
    assert "the training process was short of CPU" in second["summary"], second["summary"]
    assert "the training process, the consumer" in top["summary"]
    # no quota over the rank (nothing throttled): the CPUs were crowded, cpu_contention
    for name in ("cfs_throttled_ratio", "cfs_throttled_seconds_rate"):
        del tr.signals[name]
    crowded = wire(diagnosis.analyse(tr, facts=RankFacts(quota_measured=True)))
    assert crowded["causes"][0]["cause"] == "cpu_contention", crowded["causes"]
    assert "kept off the CPU" in crowded["causes"][0]["summary"]


def test_which_cpu_cause_held_a_side_back_is_the_kernel_s_record():
    """Throttled or crowded, by cpu.stat: the consumer of a rank throttled in a tenth of
    its periods is cpu_throttle even where nothing says the quota (a recorded trace: the
    lab's trainer-throttled run was named cpu_contention); its workers are held back by
    the quota where its throttled seconds are at least half of their CPU wait, by a crowd
    where they are not (schedstat counts both as waiting)."""
    events, _ = synth.simulate(400, 4, lambda k, t: 0.02, lambda k, t: 0.15,
                               transfer=lambda k, t: 0.06 if (t % 6) < 2 else 0.0002)
    tr = trace_of(events, workers=4)
    span = (int(tr.t_end[0] - tr.interval[0]), int(tr.t_end[-1]))

    def signal(name, v):
        tr.signals[name] = Series.from_points(synth.sampled(lambda t: v, *span))
    signal("cfs_throttled_ratio", 0.9)
    signal("cfs_throttled_seconds_rate", 0.5)
    signal("loader_main_cpu_wait_ratio", 0.15)
    signal("loader_workers_cpu_wait_ratio", 0.006)
    signal("loader_workers_idle_ratio", 0.99)
    unknown = RankFacts()
    assert wire(diagnosis.analyse(tr, facts=unknown))["causes"][0]["cause"] == "cpu_throttle"
    # the workers' side: 0.5 throttled seconds a second against 4 workers' waits
    assert consumer.throttled(tr)
    signal("loader_workers_cpu_wait_ratio", 0.2)   # 0.8 s/s of waiting: the quota's 0.5 is over half
    assert consumer.workers_throttled(tr)
    signal("loader_workers_cpu_wait_ratio", 0.4)   # 1.6 s/s: a crowd, mostly
    assert not consumer.workers_throttled(tr)
    signal("cfs_throttled_ratio", 0.05)            # under the line: no quota held them back
    signal("loader_workers_cpu_wait_ratio", 0.2)
    assert not consumer.throttled(tr) and not consumer.workers_throttled(tr)
    # the held-back share, where the cfs exporter measured it: the throttled seconds over
    # the CPUs the cgroup's processes spread across. 4 workers on 2 CPUs all held back
    # by the quota 40 % of the time: 0.8 throttled s/s (once per CPU), 1.6 s/s of their
    # waits; over the workers that read 0.5, a crowd's half (drawn 443 and 439, issue 49)
    signal("cfs_throttled_ratio", 0.9)
    signal("cfs_throttled_seconds_rate", 0.8)
    signal("loader_workers_cpu_wait_ratio", 0.4)
    assert consumer.throttled_share(tr) == pytest.approx(0.5, abs=0.01)
    signal("cfs_held_back_ratio", 0.4)
    assert consumer.throttled_share(tr) == pytest.approx(1.0, abs=0.01)
    assert consumer.workers_throttled(tr)
    signal("cfs_held_back_ratio", 0.12)            # held back 12 % of their 40 %: a crowd
    assert not consumer.workers_throttled(tr)
