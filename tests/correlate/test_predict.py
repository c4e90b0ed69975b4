"""The prediction models (correlate/predict.py) on injected numbers: each expected value
is derived here from what was injected, not copied from a run."""
import math

import numpy as np
import pytest

from stallscope.correlate import cpulimit, predict
from stallscope.correlate.predict import Measured, replay
from tests.helpers.correlate import wire


def _m(load, compute, workers=2, **kw):
    load, compute = np.asarray(load, float), np.asarray(compute, float)
    step = max(compute.mean(), load.mean() / workers)
    kw.setdefault("data_wait_ratio", 1 - compute.mean() / step)
    return Measured(step_seconds=step, compute=compute, load=load, workers=workers, prefetch=2, **kw)


def test_replay_constant_times_matches_the_closed_form():
    # W workers of T_l each deliver a batch every T_l/W; with compute T_c < T_l/W the
    # loop waits T_l/W - T_c a batch: the step is T_l/W and the wait share 1 - T_c W/T_l
    wait, step = replay(np.array([0.48]), np.array([0.15]), 2)
    assert step == pytest.approx(0.24, rel=0.01)
    assert wait == pytest.approx(1 - 0.15 / 0.24, rel=0.01)
    wait, step = replay(np.array([0.48]), np.array([0.15]), 4)
    assert wait == pytest.approx(0.0, abs=1e-9) and step == pytest.approx(0.15, rel=1e-6)


def test_means_say_four_workers_spread_needs_more():
    # same mean load (0.48 s) as above, but one batch in 8 costs 8x the others: ceil(T_l/T_c)
    # = 4 workers keep up on the means, in-order delivery with that spread does not
    rng = np.random.default_rng(1)
    heavy = np.where(rng.random(400) < 0.125, 1.0, 0.0)
    load = 0.48 * (heavy * 8 + (1 - heavy)) / (0.125 * 8 + 0.875)
    wait4, _ = replay(load, np.full(400, 0.15), 4)
    assert wait4 > predict.TARGET  # the means' answer leaves a stall
    p = wire(predict.workers(_m(load, np.full(400, 0.15))))
    assert p["settings"]["num_workers"] > 4
    assert p["predicted_data_wait_ratio"] <= predict.TARGET
    assert "the means alone say 4" in p["basis"]


def test_too_few_workers_names_the_count_and_step():
    p = wire(predict.for_cause("too_few_workers", _m(np.full(100, 0.48), np.full(100, 0.15))))
    assert p["settings"] == {"num_workers": 4}
    assert p["predicted_step_seconds"] == pytest.approx(0.15, rel=0.01)
    assert p["speedup"] == pytest.approx(0.24 / 0.15, rel=0.01)
    for key in ("change", "predicted_data_wait_ratio", "basis", "confidence"):
        assert key in p


def test_quota_cap_names_the_cpu_limit_not_workers():
    # 2 workers need 0.08 CPU-s a batch; a 0.4-core quota delivers one batch per 0.2 s at
    # best against 0.15 s of compute: no worker count fixes it. Constant times (no spread)
    # and pure CPU work (no throttling figures: the load shrinks to the CPU share): the
    # smallest limit over the demand 0.08 / 0.15 = 0.533 cores, 0.55, keeps up
    m = _m(np.full(100, 0.4), np.full(100, 0.15), quota_cores=0.4, workers_cpu_cores=0.4)
    assert m.cpu_per_batch == pytest.approx(0.08)
    p = wire(predict.for_cause("too_few_workers", m))
    assert p["settings"] == {"cpu_limit_cores": pytest.approx(0.55)}
    assert p["workers_alone_useless"] is True
    # under the new limit the floor is 0.08 / 0.55 = 0.145 s < compute: the step is the compute
    assert p["predicted_step_seconds"] == pytest.approx(0.15, rel=0.02)
    # and more workers under the old quota: the replay stays on the 0.2 s floor
    _, step = replay(np.full(100, 0.08), np.full(100, 0.15), 8, floor=0.08 / 0.4)
    assert step == pytest.approx(0.2, rel=0.01)


def test_shared_quota_keeps_a_core_per_rank():
    m = _m(np.full(100, 0.4), np.full(100, 0.15), quota_cores=4.0, quota_ranks=2,
           workers_cpu_cores=0.4)
    assert m.loader_cores == pytest.approx(1.0)
    # per rank 0.55 cores for the workers (as above) + 1 for the loop, for 2 ranks: 3.1 cores
    assert cpulimit.needed_cpu_limit(m) == pytest.approx(3.1)


def _throttled(load, compute, held_back, crowded=0.0, workers=2, quota=0.4):
    """A rank whose workers the quota held back ``held_back`` of their time and the node's
    other tasks ``crowded`` besides; CPU demand 0.08 CPU-s a batch."""
    m = _m(load, compute, workers=workers, quota_cores=quota, throttled_seconds_rate=held_back * workers,
           runqueue_ratio=held_back + crowded)
    return Measured(**{**m.__dict__, "workers_cpu_cores": 0.08 / m.step_seconds})


def test_cpu_limit_margin_is_what_the_measured_spread_needs():
    # The same mean demand (0.08 CPU-s against 0.15 s of compute: 0.533 cores) with and
    # without spread in the compute times: the limit that keeps the replayed wait under
    # the target is higher with the spread, and one step less would not do
    rng = np.random.default_rng(3)
    flat = _throttled(np.full(300, 0.4), np.full(300, 0.15), held_back=0.6)
    wide = _throttled(np.full(300, 0.4), 0.15 * rng.choice([0.5, 1.5], 300), held_back=0.6)
    a, b = wire(cpulimit.cpu_limit(flat)), wire(cpulimit.cpu_limit(wide))
    assert a["settings"]["cpu_limit_cores"] == pytest.approx(0.55)
    assert b["settings"]["cpu_limit_cores"] > a["settings"]["cpu_limit_cores"]
    for m, p in ((flat, a), (wide, b)):
        assert p["predicted_data_wait_ratio"] <= predict.TARGET
        below = p["settings"]["cpu_limit_cores"] - cpulimit.LIMIT_STEP
        wait, _ = replay(cpulimit.unthrottled_load(m), m.compute, 2, 2, 0.08 / below)
        assert wait > predict.TARGET, (p, wait)
    # unthrottled, each batch takes the 40 % of its time the quota did not hold it back
    assert cpulimit.unthrottled_load(flat) == pytest.approx(np.full(300, 0.16))


def test_workers_too_slow_even_unthrottled_are_raised_with_the_limit():
    # held back 30 % by the quota, hardly crowded (5 %): unthrottled a batch still takes
    # 0.7 x 0.6 s = 0.42 s, so 2 workers deliver one per 0.21 s > 0.15 s of compute whatever
    # the limit: the change raises the workers too (3: one per 0.14 s)
    m = _throttled(np.full(300, 0.6), np.full(300, 0.15), held_back=0.3, crowded=0.05)
    p = wire(cpulimit.cpu_limit(m))
    assert p["settings"]["num_workers"] == 3
    assert p["predicted_data_wait_ratio"] <= predict.TARGET


def test_the_search_over_more_workers_bisects_only_a_count_whose_top_limit_keeps_up(monkeypatch):
    """cpu_limit tries w+1 .. 4w workers for a limit that reaches the target; a count
    whose replay at the top of the limit grid does not is passed over after that one
    replay (only_target), and a count that does gets the full search's limit."""
    m = _throttled(np.full(300, 0.6), np.full(300, 0.15), held_back=0.3, crowded=0.05)
    load = cpulimit.unthrottled_load(m)
    short = cpulimit.limit_search(m, load, 2, only_target=True)  # 0.21 s a batch: never
    assert short[1] > predict.TARGET
    assert short[0] == pytest.approx(math.ceil(cpulimit.LIMIT_SPAN * m.cpu_per_batch / m.compute_mean
                                               / cpulimit.LIMIT_STEP) * cpulimit.LIMIT_STEP)
    assert cpulimit.limit_search(m, load, 3, only_target=True) == cpulimit.limit_search(m, load, 3)
    calls = []
    real = cpulimit.replay
    monkeypatch.setattr(cpulimit, "replay", lambda *a, **k: calls.append(1) or real(*a, **k))
    cpulimit.limit_search(m, load, 2, only_target=True)
    assert len(calls) == 1
    cpulimit.limit_search(m, load, 2)
    assert len(calls) > 2


def test_a_crowded_node_caps_the_loader_at_the_share_it_gave():
    # held back 30 % by the quota and 40 % more by the node's other tasks. The workers used
    # 0.08 CPU-s per 0.3 s step = 0.267 cores, 0.133 each; while runnable they ran
    # 0.133 / (0.133 + 0.4) = 25 % of the time, so unthrottled the node gives them
    # 2 x (0.133 + 0.3 x 0.25) = 0.417 cores: one batch per 0.08 / 0.417 = 0.192 s at best.
    # No limit and no worker count is promised to beat that (more workers would, on the
    # per-worker rate: 3 x 0.14 s); here the 2 workers' own pace, 0.7 x 0.6 / 2 = 0.21 s a
    # batch, is slower still and sets the step. The wait that remains is said
    m = _throttled(np.full(300, 0.6), np.full(300, 0.15), held_back=0.3, crowded=0.4)
    assert m.crowded == pytest.approx(0.4)
    assert m.node_cores == pytest.approx(2 * (0.08 / 0.3 / 2 + 0.3 * 0.25), rel=1e-3)
    p = wire(cpulimit.cpu_limit(m))
    assert "num_workers" not in p["settings"]
    assert p["crowded_ratio"] == pytest.approx(0.4)
    assert 0.08 / m.node_cores < 0.21
    assert p["predicted_step_seconds"] == pytest.approx(0.21, rel=0.02)
    assert p["predicted_data_wait_ratio"] == pytest.approx(1 - 0.15 / 0.21, abs=0.02)
    assert "no limit brings the wait under the line" in p["basis"]


def test_persistent_workers_removes_the_first_batch_cost():
    # 100 batches, 2 of them epoch starts of 1 s each (their interval is their wait), the
    # 98 others 0.1 s of compute without a wait (step_seconds: the steady batches' mean)
    total = 98 * 0.1 + 2.0
    m = Measured(step_seconds=0.1, compute=np.full(98, 0.1), data_wait_ratio=2.0 / total,
                 workers=2, persistent=False, iterator_starts=2, iterator_start_wait_seconds=2.0,
                 steady_wait_seconds=0.0, batches=100)
    p = wire(predict.for_cause("epoch_start", m))
    assert p["settings"] == {"persistent_workers": True}
    assert p["predicted_data_wait_ratio"] == pytest.approx(0.0, abs=1e-6)
    assert p["predicted_step_seconds"] == pytest.approx(0.1, rel=1e-6)
    assert p["first_batch_seconds"] == pytest.approx(1.0)
    assert wire(predict.for_cause("epoch_start", Measured(**{**m.__dict__, "persistent": True})))[
        "confidence"] == "upper bound"


def test_no_configuration_fix_gives_the_headroom():
    m = _m(np.full(50, 0.3), np.full(50, 0.1))
    p = wire(predict.for_cause("fuse_unhealthy", m))
    assert p["settings"] == {} and p["confidence"] == "upper bound"
    assert p["predicted_step_seconds"] == pytest.approx(0.1)
    assert p["speedup"] == pytest.approx(1.5)
    h = wire(predict.headroom(m))
    assert h["step_seconds_without_wait"] == pytest.approx(0.1)


def test_shm_size_from_the_measured_use():
    m = _m(np.full(50, 0.3), np.full(50, 0.1), shm_size_bytes=16 * 2**20, shm_used_bytes=15 * 2**20)
    p = wire(predict.for_cause("shm_exhaustion", m))
    assert p["settings"]["shm_mib"] >= 32


def test_no_limit_is_named_when_the_quota_does_not_hold_the_workers_back():
    # the quota-capped run at load 51: the workers waited 90 % for a core and the quota held
    # them back 0 %: they did not even use it up, so a larger one buys nothing
    m = _throttled(np.full(100, 1.0), np.full(100, 0.165), held_back=0.0, crowded=0.9)
    assert wire(cpulimit.cpu_limit(m)) is None
    assert wire(predict.for_cause("cpu_throttle", m))["confidence"] == "upper bound"


def _brownouts(seconds=36.0, period=12.0, slow_for=5.0, slow=0.8, fast=0.04, workers=2):
    """Load samples as 2 workers measure them under storage brownouts: each batch takes
    ``slow`` during the first ``slow_for`` s of every ``period``, ``fast`` otherwise, and
    the samples come as often as the workers finish batches."""
    t, times, load = 0.0, [], []
    while t < seconds:
        cost = slow if t % period < slow_for else fast
        t += cost / workers
        times.append(t)
        load.append(cost)
    return np.array(load), np.array(times)


def test_brownouts_replayed_in_time_need_more_workers_than_drawn_apart():
    # 5 s at 0.8 s a batch: the loop takes a batch every 0.15 s, so W workers fall behind by
    # 1/0.15 - W/0.8 batches a second for 5 s, which a queue of 2W batches must cover:
    # W >= 5 (deficit 0.4/s x 5 s = 2 < 10). Drawn independently the slow samples are spread
    # through the replay, and the mean (0.36 s) asks for fewer.
    load, times = _brownouts()
    compute = np.full(200, 0.15)
    apart = wire(predict.workers(_m(load, compute)))
    timed = wire(predict.workers(_m(load, compute, load_times=times)))
    w_apart, w_timed = apart["settings"]["num_workers"], timed["settings"]["num_workers"]
    assert w_timed > w_apart
    assert w_timed >= 5
    # at the count drawn apart, the brownouts replayed in time still make the loop wait
    wait, _ = replay(load, compute, w_apart, times=times)
    assert wait > predict.TARGET
    # the same samples with no time structure (shuffled along the window): about the same
    # answer as drawn apart
    shuffled = np.random.default_rng(3).permutation(load)
    flat = wire(predict.workers(_m(shuffled, compute, load_times=times)))
    assert abs(flat["settings"]["num_workers"] - w_apart) <= 1


def test_load_times_all_at_one_moment_replay_as_drawn_apart():
    load, compute = np.array([0.3, 0.6, 0.9, 0.3]), np.full(4, 0.15)
    assert replay(load, compute, 3, times=np.zeros(4)) == replay(load, compute, 3)


MiB = 1 << 20


def _off_cpu(workers=1, memory=None):
    # the newcomer: each batch of 8 samples waits 8 x 50 ms off the CPU (a fetch),
    # against 10 ms of compute: 0.4 / 0.01 = 40 workers on the means
    return _m(np.full(200, 0.4), np.full(200, 0.01), workers=workers, memory=memory)


def test_a_memory_limit_caps_the_worker_count_at_what_it_holds():
    free = predict.workers(_off_cpu())
    assert free.settings.num_workers >= 40 and free.memory_note is None
    # 4 GiB limit, 2.5 GiB in use, 300 MiB a worker: (4096 - 2560) // 300 = 5 more, 6 in all
    mem = predict.Memory(4096 * MiB, 2560 * MiB, 300 * MiB)
    assert mem.more_workers == 5
    p = wire(predict.for_cause("too_few_workers", _off_cpu(memory=mem)))
    assert p["settings"] == {"num_workers": 6}
    assert p["change"] == "raise num_workers from 1 to 6 (the most the pod's memory limit holds)"
    # the replay with 6 workers: one batch per 0.4 / 6 s against 0.01 s of compute
    assert p["predicted_step_seconds"] == pytest.approx(0.4 / 6, rel=0.02)
    assert p["predicted_data_wait_ratio"] == pytest.approx(1 - 0.01 / (0.4 / 6), rel=0.02)
    note = p["memory_note"]
    assert note.startswith("%d workers would keep up" % free.settings.num_workers)
    assert "4096 MiB, 2560 MiB in use" in note and "holds 6 at ~300 MiB" in note
    assert "threads or async I/O inside each worker" in note and note in p["basis"]


def test_a_limit_with_room_for_more_than_needed_changes_nothing():
    free = predict.workers(_off_cpu())
    roomy = predict.Memory(64 << 30, 1 << 30, 100 * MiB)
    p = predict.workers(_off_cpu(memory=roomy))
    assert p.settings == free.settings and p.memory_note is None
    # no limit, or a size not measured: not bounded
    assert predict.Memory(None, 1 << 30, 100 * MiB).more_workers is None
    assert predict.Memory(4 << 30, None, 100 * MiB).more_workers is None


def test_no_room_for_another_worker_rules_more_workers_out():
    full = predict.Memory(1024 * MiB, 1000 * MiB, 300 * MiB)
    m = _off_cpu(workers=3, memory=full)
    assert m.memory_workers == 3 and predict.workers(m) is None
    p = wire(predict.for_cause("too_few_workers", m))
    assert p["settings"] == {} and p["rules_out"] == ["num_workers"]
    assert "the pod's memory limit holds no more workers" in p["change"]
    assert "holds 3 at ~300 MiB" in p["basis"]


def test_a_saturated_link_rules_more_workers_out_and_its_capacity_buys_the_step():
    """The bytes/s math (issue 31): 2 MiB a batch, 0.15 s of compute, a link of 6 MB/s all
    the rank's at capacity. 2 workers sharing it take 2 x 2 MiB / 6 MB/s = 0.7 s a batch
    each: one batch every 0.35 s. More workers share the same 6 MB/s; a link of demand
    (14 MB/s) x 1.2 gives the compute's pace back."""
    from stallscope.correlate.queue import Link

    per_batch = 2 * 1024 * 1024
    link = Link(ratio=0.98, capacity=6e6, rank_bytes_per_second=6e6 * 0.98, bytes_per_batch=per_batch)
    load = np.full(60, 2 * per_batch / link.rank_bytes_per_second)
    m = _m(load, np.full(60, 0.15), workers=2, link=link)
    assert link.floor() == pytest.approx(per_batch / 6e6, rel=0.01)
    # more workers: none is predicted to help, and the report says why
    assert predict.workers(m) is None
    why = predict.why_not_more_workers(m)
    assert why is not None and "share the same link" in why
    tfw = predict.for_cause("too_few_workers", m)
    assert tfw.rules_out == ("num_workers",) and not tfw.settings
    p = predict.for_cause("bandwidth_bound", m)
    demand = per_batch / 0.15
    assert p.settings.link_capacity_bytes_per_second == pytest.approx(demand * 1.2, rel=0.08)
    # at that rate each worker's batch takes 2 x 2 MiB / 16.8 MB/s = 0.25 s: 2 workers
    # deliver one every 0.125 s, under the compute: the step is the compute's
    assert p.predicted_step_seconds == pytest.approx(0.15, rel=0.05)
    assert p.predicted_data_wait_ratio < 0.05 and p.rules_out == ("num_workers",)
    # a link not at capacity: no floor, no bandwidth prediction
    idle = Link(ratio=0.3, capacity=6e6, rank_bytes_per_second=1.8e6, bytes_per_batch=per_batch)
    m2 = _m(load, np.full(60, 0.15), workers=2, link=idle)
    assert predict.link_floor(m2) == 0.0 and predict.bandwidth(m2) is None
    assert predict.workers(m2) is not None
