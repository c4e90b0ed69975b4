"""The prediction models (correlate/predict.py) on injected numbers: each expected value
is derived here from what was injected, not copied from a run."""
import numpy as np
import pytest

from stallscope.correlate import predict
from stallscope.correlate.predict import Measured, replay


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
    p = predict.workers(_m(load, np.full(400, 0.15)))
    assert p["settings"]["num_workers"] > 4
    assert p["predicted_data_wait_ratio"] <= predict.TARGET
    assert "the means alone say 4" in p["basis"]


def test_too_few_workers_names_the_count_and_step():
    p = predict.for_cause("too_few_workers", _m(np.full(100, 0.48), np.full(100, 0.15)))
    assert p["settings"] == {"num_workers": 4}
    assert p["predicted_step_seconds"] == pytest.approx(0.15, rel=0.01)
    assert p["speedup"] == pytest.approx(0.24 / 0.15, rel=0.01)
    for key in ("change", "predicted_data_wait_ratio", "basis", "confidence"):
        assert key in p


def test_quota_cap_names_the_cpu_limit_not_workers():
    # 2 workers need 0.08 CPU-s a batch; a 0.4-core quota delivers one batch per 0.2 s at
    # best against 0.15 s of compute: no worker count fixes it, a limit of
    # 1.25 x 0.08 / 0.15 = 0.67 -> 0.7 cores does
    m = _m(np.full(100, 0.4), np.full(100, 0.15), quota_cores=0.4, workers_cpu_cores=0.4)
    assert m.cpu_per_batch == pytest.approx(0.08)
    p = predict.for_cause("too_few_workers", m)
    assert p["settings"] == {"cpu_limit_cores": 0.7}
    assert p["workers_alone_useless"] is True
    # under the new limit the floor is 0.08 / 0.7 = 0.114 s < compute: the step is the compute
    assert p["predicted_step_seconds"] == pytest.approx(0.15, rel=0.02)
    # and more workers under the old quota: the replay stays on the 0.2 s floor
    _, step = replay(np.full(100, 0.08), np.full(100, 0.15), 8, floor=0.08 / 0.4)
    assert step == pytest.approx(0.2, rel=0.01)


def test_shared_quota_keeps_a_core_per_rank():
    m = _m(np.full(100, 0.4), np.full(100, 0.15), quota_cores=4.0, quota_ranks=2,
           workers_cpu_cores=0.4)
    assert m.loader_cores == pytest.approx(1.0)
    # per rank 0.67 cores for the workers + 1 for the loop, for 2 ranks: 3.4 cores
    assert predict.needed_cpu_limit(m) == pytest.approx(3.4)


def test_persistent_workers_removes_the_first_batch_cost():
    # 100 batches of 0.1 s compute, no steady wait; 2 epoch starts of 1 s each
    total = 100 * 0.1 + 2.0
    m = Measured(step_seconds=total / 100, compute=np.full(98, 0.1), data_wait_ratio=2.0 / total,
                 workers=2, persistent=False, iterator_starts=2, iterator_start_wait_seconds=2.0,
                 steady_wait_seconds=0.0, batches=100)
    p = predict.for_cause("epoch_start", m)
    assert p["settings"] == {"persistent_workers": True}
    assert p["predicted_data_wait_ratio"] == pytest.approx(0.0, abs=1e-6)
    assert p["predicted_step_seconds"] == pytest.approx(0.1, rel=1e-6)
    assert p["first_batch_seconds"] == pytest.approx(1.0)
    assert predict.for_cause("epoch_start", Measured(**{**m.__dict__, "persistent": True}))[
        "confidence"] == "upper bound"


def test_no_configuration_fix_gives_the_headroom():
    m = _m(np.full(50, 0.3), np.full(50, 0.1))
    p = predict.for_cause("fuse_unhealthy", m)
    assert p["settings"] == {} and p["confidence"] == "upper bound"
    assert p["predicted_step_seconds"] == pytest.approx(0.1)
    assert p["speedup"] == pytest.approx(1.5)
    h = predict.headroom(m)
    assert h["step_seconds_without_wait"] == pytest.approx(0.1)


def test_shm_size_from_the_measured_use():
    m = _m(np.full(50, 0.3), np.full(50, 0.1), shm_size_bytes=16 * 2**20, shm_used_bytes=15 * 2**20)
    p = predict.for_cause("shm_exhaustion", m)
    assert p["settings"]["shm_mib"] >= 32
