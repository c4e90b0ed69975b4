import numpy as np

from stallscope import vocabulary
from stallscope.correlate import causes, diagnosis, workers
from stallscope.correlate.period import stall_period
from stallscope.correlate.trace import WaitIndex
from stallscope.lab import synth
from tests.helpers.correlate import simulated, trace_of, wire

SEC = synth.SEC


def episodic_run(seed=1, workers=4, base=0.2, factor=6.0, every=30.0, on=10.0, n=1200):
    """A loader that is fine except in episodes (on of every ``every`` seconds)."""
    t0 = 100.0

    def ep(t):
        return ((t - t0) % every) >= every - on
    rng = np.random.default_rng(seed)
    j = synth.jitter(rng, 0.05)
    ev, ph = synth.simulate(n, workers, lambda k, t: j(base * (factor if ep(t) else 1.0)),
                            lambda k, t: j(0.1), t0=int(t0 * SEC))
    return ev, ep


def scores(tr):
    found, _ = wire(causes.score_signal_causes(tr, WaitIndex(tr.t_end, tr.wait)))
    return {c["cause"]: c for c in found}


def test_signal_aligned_with_stalls_beats_a_high_but_flat_one():
    ev, ep = episodic_run()
    s, e = synth.span_of(ev)
    tr = trace_of(ev, signals={
        "cfs_throttled_ratio": synth.sampled(lambda t: 0.6 if ep(t) else 0.01, s, e),
        "shm_used_ratio": synth.sampled(lambda t: 0.95, s, e)})  # high all along: a decoy
    got = scores(tr)
    assert got["cpu_throttle"]["score"] > 0.7
    assert got["shm_exhaustion"]["score"] < 0.1
    ev_thr = got["cpu_throttle"]["evidence"][0]
    assert ev_thr["signal"] == "cfs_throttled_ratio" and ev_thr["threshold"] == 0.1
    assert ev_thr["during_stalls"] > 0.3 > ev_thr["outside_stalls"]
    decoy = got["shm_exhaustion"]["evidence"][0]
    assert decoy["explained_wait_share"] > 0.9 and decoy["quiet_time_active_share"] > 0.9
    d = wire(diagnosis.analyse(tr))
    assert [c["cause"] for c in d["causes"]][0] == "cpu_throttle"
    assert "cfs_throttled_ratio" in d["causes"][0]["summary"]


def test_same_signal_flat_high_is_not_blamed():
    ev, _ = episodic_run(seed=2)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, signals={"cfs_throttled_ratio": synth.sampled(lambda t: 0.6, s, e)})
    d = wire(diagnosis.analyse(tr))
    assert d["verdict"] == "input_bound"
    assert d["causes"][0]["cause"] == "unexplained"
    assert "closest is" in d["causes"][0]["summary"]


def test_continuous_stalls_rest_on_the_level_and_say_so():
    ev, _ = simulated(3, 4, load=1.0, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, signals={"cfs_throttled_ratio": synth.sampled(lambda t: 0.5, s, e),
                               "workers_cpu_ratio": synth.sampled(lambda t: 0.4, s, e)},
                  node_signals={"psi_io_some_ratio": synth.sampled(lambda t: 0.5, s, e)})
    got = scores(tr)
    assert got["cpu_throttle"]["score"] == causes.LEVEL_ONLY_RANK
    assert got["io_pressure"]["score"] == causes.LEVEL_ONLY_NODE  # node-wide: weaker
    assert "level alone" in got["cpu_throttle"]["summary"]
    d = wire(diagnosis.analyse(tr))
    assert d["causes"][0]["cause"] == "cpu_throttle"
    tfw = next(c for c in d["causes"] if c["cause"] == "too_few_workers")
    assert tfw["score"] < d["causes"][0]["score"]  # throttled workers: not their number


def test_below_threshold_direction_and_rank_scope_first():
    ev, ep = episodic_run(seed=3)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, signals={"fuse_up": synth.sampled(lambda t: 0.0 if ep(t) else 1.0, s, e),
                               "psi_io_some_ratio": synth.sampled(lambda t: 0.0, s, e)},
                  node_signals={"psi_io_some_ratio": synth.sampled(
                      lambda t: 0.9 if ep(t) else 0.0, s, e)})
    got = scores(tr)
    assert got["fuse_unhealthy"]["score"] > 0.7
    assert got["fuse_unhealthy"]["evidence"][0]["direction"] == "below"
    assert got["io_pressure"]["evidence"][0]["scope"] == "rank"  # the pod's own PSI wins
    assert got["io_pressure"]["score"] == 0.0


def test_unexplained_when_nothing_has_a_signal():
    ev, _ = episodic_run(seed=4)
    d = wire(diagnosis.analyse(trace_of(ev, workers=None)))
    # only the run's first batch started an iterator: epoch_start is evaluated, and small
    first = [c for c in d["causes"] if c["cause"] == "epoch_start"][0]
    assert first["score"] < 0.05 and first["evidence"][0]["starts"] == 1
    assert d["causes"][0]["cause"] == "unexplained" and d["causes"][0]["score"] == 1.0 - first["score"]
    assert "closest is epoch_start" in d["causes"][0]["summary"]
    assert set(d["not_evaluated"]) == set(causes.VOCABULARY) - {"unexplained", "epoch_start"}


def test_ranking_vocabulary_and_scores_are_bounded():
    ev, ep = episodic_run(seed=5)
    s, e = synth.span_of(ev)
    sig = {name: synth.sampled(lambda t: 0.95 if ep(t) else 0.0, s, e) for name in (
        "cfs_throttled_ratio", "shm_used_ratio", "cache_miss_ratio", "psi_memory_some_ratio")}
    d = wire(diagnosis.analyse(trace_of(ev, signals=sig)))
    names = [c["cause"] for c in d["causes"]]
    assert set(names) <= set(causes.VOCABULARY) and names[-1] != names[0]
    assert all(0.0 <= c["score"] <= 1.0 for c in d["causes"])
    assert [c["score"] for c in d["causes"]] == sorted((c["score"] for c in d["causes"]), reverse=True)
    for c in d["causes"]:
        assert set(c) - {"prediction"} == {"cause", "score", "summary", "evidence", "kind"}
        assert c["kind"] == vocabulary.CAUSE[c["cause"]].kind
        for ev_ in c["evidence"]:
            assert {"signal", "during_stalls", "outside_stalls", "threshold"} <= set(ev_)


def test_too_few_workers_from_load_time_and_busy_workers():
    ev, _ = simulated(6, 3, load=0.45, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, workers=3, signals={
        "batch_load_seconds": synth.sampled(lambda t: 0.45, s, e),
        "workers_cpu_ratio": synth.sampled(lambda t: 2.85, s, e)})  # summed over 3 workers
    got = wire(workers.score(tr, stall_period(tr)))
    assert got["score"] > 0.9
    assert "each of the 3 workers takes 0.45s" in got["summary"]
    load = got["evidence"][0]
    assert load["during_stalls"] == 0.15 and abs(load["threshold"] - 0.1) < 0.01


def test_workers_off_the_cpu_say_what_the_sampler_found_them_doing():
    """Issue 30: "they wait on something no signal shows" was said even where the
    loader-state sampler measured it; with its shares the summary names the state."""
    ev, _ = simulated(6, 3, load=0.45, compute=0.1)
    s, e = synth.span_of(ev)
    signals = {"batch_load_seconds": synth.sampled(lambda t: 0.45, s, e),
               "workers_cpu_ratio": synth.sampled(lambda t: 0.3, s, e)}  # 10% of a core each
    tr = trace_of(ev, workers=3, signals=signals)
    blind = wire(workers.score(tr, stall_period(tr)))
    assert "something no signal shows" in blind["summary"]
    signals.update({"loader_workers_network_ratio": synth.sampled(lambda t: 0.82, s, e),
                    "loader_workers_idle_ratio": synth.sampled(lambda t: 0.03, s, e),
                    "loader_workers_storage_ratio": synth.sampled(lambda t: 0.0, s, e)})
    tr = trace_of(ev, workers=3, signals=signals)
    got = wire(workers.score(tr, stall_period(tr)))
    assert "the loader-state sampler found them blocked on the network 82% of their time" in got["summary"]
    assert "idle" not in got["summary"] and "no signal shows" not in got["summary"]
    assert got["score"] == blind["score"]  # what they wait on is said; more workers still overlap it


def test_too_few_workers_is_not_claimed_for_episodic_stalls():
    ev, _ = episodic_run(seed=7)
    tr = trace_of(ev, workers=4)
    got = wire(workers.score(tr, stall_period(tr)))
    assert got["score"] < 0.4
    assert "come and go" in got["summary"]


def test_num_workers_zero_loads_in_the_loop():
    ev, _ = simulated(8, 0, load=0.2, compute=0.1)
    tr = trace_of(ev, workers=0)
    d = wire(diagnosis.analyse(tr))
    assert d["verdict"] == "input_bound"
    assert d["causes"][0]["cause"] == "too_few_workers"
    assert "num_workers=0" in d["causes"][0]["summary"]


def test_on_off_signal_during_continuous_stalls_must_lengthen_the_waits():
    ev, _ = simulated(9, 4, load=0.8, compute=0.1)  # stalls on every worker round
    s, e = synth.span_of(ev)
    flip = synth.sampled(lambda t: 4e8 if int(t / 2) % 2 else 0.0, s, e)  # on/off every 2 s
    got = scores(trace_of(ev, node_signals={"disk_write_bytes_rate": flip}))
    cp = got["checkpoint_contention"]
    assert cp["evidence"][0]["judged_by"] == "intensity"
    assert cp["score"] < 0.2

    # a slower on/off pattern (10 s), now with the loader slower while it is on
    def busy(t):
        return int(t / 10) % 2 == 1
    rng = np.random.default_rng(10)
    ev, _ = synth.simulate(1200, 4, lambda k, t: 0.5 * (3.0 if busy(t) else 1.0) * rng.lognormal(0, 0.05),
                           lambda k, t: 0.1, t0=100 * SEC)
    s, e = synth.span_of(ev)
    on = synth.sampled(lambda t: 4e8 if busy(t - 1.0) else 0.0, s, e)  # the sample covers (t-2, t]
    got = scores(trace_of(ev, node_signals={"disk_write_bytes_rate": on}))
    assert got["checkpoint_contention"]["evidence"][0]["judged_by"] == "intensity"
    assert got["checkpoint_contention"]["score"] > 0.3


def test_fast_alternating_signal_does_not_explain_episodic_stalls():
    ev, _ = episodic_run(seed=11)
    s, e = synth.span_of(ev)
    flip = synth.sampled(lambda t: 0.9 if int(t / 2) % 2 else 0.0, s, e)
    got = scores(trace_of(ev, signals={"shm_used_ratio": flip}))
    assert got["shm_exhaustion"]["score"] < 0.25


def test_workers_on_their_cores_contradict_a_cpu_shortage():
    ev, _ = simulated(12, 4, load=1.0, compute=0.1)
    s, e = synth.span_of(ev)
    sig = {"cfs_throttled_ratio": synth.sampled(lambda t: 0.5, s, e)}
    starved = wire(diagnosis.analyse(trace_of(ev, signals=dict(
        sig, workers_cpu_ratio=synth.sampled(lambda t: 0.4, s, e)))))  # 10% of a core each
    fed = wire(diagnosis.analyse(trace_of(ev, signals=dict(
        sig, workers_cpu_ratio=synth.sampled(lambda t: 3.8, s, e)))))  # 95% each
    score = {d["causes"][0]["cause"]: d["causes"][0]["score"] for d in (starved,)}
    assert score == {"cpu_throttle": causes.LEVEL_ONLY_RANK}
    throttle = next(c for c in fed["causes"] if c["cause"] == "cpu_throttle")
    assert throttle["score"] == 0.0 and "not starved" in throttle["summary"]
    assert fed["causes"][0]["cause"] == "too_few_workers"



def test_workers_waiting_for_a_cpu_are_short_of_it_and_more_of_them_would_not_help():
    """Issue 30: 4 workers holding the 2 cores of a node, no quota. Each runs half the time
    (a CPU share of 47 % that alone read as "fed" and took the crowding off the list) and
    waits for a CPU the other half; the loop waits for ready batches. Had they run whenever
    they could, each batch would take half as long: the shortage explains the wait, the
    crowded CPUs lead, and the prediction rules more workers out."""
    ev, _ = simulated(5, 4, load=0.684, compute=0.158)
    s, e = synth.span_of(ev)
    signals = {"batch_load_seconds": synth.sampled(lambda t: 0.684, s, e),
               "workers_cpu_ratio": synth.sampled(lambda t: 1.88, s, e),  # 47 % of a core each
               "workers_runqueue_ratio": synth.sampled(lambda t: 0.5, s, e)}
    blind = wire(diagnosis.analyse(trace_of(ev, workers=4, signals=signals)))
    crowded = next(c for c in blind["causes"] if c["cause"] == "cpu_contention")
    assert "waited for a CPU" not in crowded["summary"]  # the run queue's level, no model
    signals.update({"loader_workers_on_cpu_ratio": synth.sampled(lambda t: 0.47, s, e),
                    "loader_workers_cpu_wait_ratio": synth.sampled(lambda t: 0.50, s, e)})
    tr = trace_of(ev, workers=4, signals=signals)
    d = wire(diagnosis.analyse(tr))
    top = d["causes"][0]
    assert top["cause"] == "cpu_contention", d["causes"]
    # one batch every 0.171 s against 0.158 s; fed, every 0.171 x 0.47 / 0.97 = 0.083 s: the
    # shortage explains all of the lateness, and the wait is all ready-wait (no split: 1)
    explained, _ = workers.cpu_short(tr, WaitIndex(tr.t_end, tr.wait), tr.compute_ns() / 1e9)
    assert explained == 1.0 and top["score"] == 1.0
    assert "waited for a CPU 50% of their time during the stalls and ran 47%" in top["summary"]
    assert "more workers would share the same CPUs" in top["summary"]
    assert top["prediction"]["rules_out"] == ["num_workers"] and not top["prediction"]["settings"]
    tfw = next(c for c in d["causes"] if c["cause"] == "too_few_workers")
    assert "short of CPU, which more of them would share" in tfw["summary"]
    assert "mostly off the CPU" not in tfw["summary"]
    # the same workers running whenever they can (fed): no shortage is claimed
    signals["loader_workers_cpu_wait_ratio"] = synth.sampled(lambda t: 0.02, s, e)
    signals["loader_workers_on_cpu_ratio"] = synth.sampled(lambda t: 0.95, s, e)
    fed = wire(diagnosis.analyse(trace_of(ev, workers=4, signals=signals)))
    assert fed["causes"][0]["cause"] == "too_few_workers", fed["causes"]


def test_zero_length_samples_do_not_poison_the_score():
    """Worker samples merged slightly out of order can share a time stamp; the sample of
    zero length between them waited nothing and must not turn the score into NaN."""
    import math
    import warnings

    from stallscope import vocabulary
    from stallscope.correlate import causes, trace

    probe = vocabulary.line_of("cpu_throttle", "cfs_throttled_ratio")
    s = 10**9
    # one sample a second, the 4th stamped like the 3rd; the signal is high in 2 and 4
    series = trace.Series.from_points([(1 * s, 0.0), (2 * s, 0.5), (3 * s, 0.0), (3 * s, 0.5),
                                       (4 * s, 0.0), (5 * s, 0.0), (6 * s, 0.0)])
    # stalls of 0.5 s inside seconds 2 and 4 only
    waits = trace.WaitIndex([int(1.9 * s), int(3.9 * s)], [s // 2, s // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a division by zero would raise here
        out = causes.score_probe(probe, "rank", series, waits, (0, 7 * s))
    assert out is not None
    for name in ("explained", "score"):
        value = getattr(out, name)
        assert not math.isnan(value), (name, out)
