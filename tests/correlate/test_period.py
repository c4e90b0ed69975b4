import numpy as np
import pytest

from stallscope.correlate.period import period_of, stall_period
from tests.helpers.correlate import events_from_waits, simulated, trace_of


def spiky(n, period, rng, spike=0.3, jitter_index=0, miss=0.0, base=0.0002):
    waits = base * rng.lognormal(0, 0.3, n)
    for k in range(period, n, period):
        if rng.random() < miss:
            continue
        j = k + (int(rng.integers(-jitter_index, jitter_index + 1)) if jitter_index else 0)
        if 0 <= j < n:
            waits[j] = spike * rng.lognormal(0, 0.3)
    return waits


@pytest.mark.parametrize("period", [2, 3, 8, 25])
def test_periodic_stalls_with_amplitude_and_time_jitter(period):
    rng = np.random.default_rng(period)
    waits = spiky(1000, period, rng)
    ev = events_from_waits(waits, compute_s=0.1)
    got = stall_period(trace_of(ev))
    assert got.period_steps == period
    # seconds follow from what was injected: period x (compute + a mean spike share)
    assert period * 0.1 < got.period_seconds < period * 0.1 + 1.0


def test_index_jitter_and_missed_spikes_keep_the_period():
    rng = np.random.default_rng(7)
    waits = spiky(1500, 10, rng, jitter_index=1, miss=0.15)
    assert stall_period(trace_of(events_from_waits(waits))).period_steps == 10


def test_no_stalls_means_period_zero():
    rng = np.random.default_rng(1)
    waits = 0.0002 * rng.lognormal(0, 0.3, 800)
    got = stall_period(trace_of(events_from_waits(waits)))
    assert got.stall_batches == 0 and got.period_steps == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_stalls_have_no_period(seed):
    rng = np.random.default_rng(seed)
    waits = np.where(rng.random(1500) < 0.1, 0.3, 0.0002)
    got = stall_period(trace_of(events_from_waits(waits)))
    assert got.stall_batches > 50
    assert got.period_steps == 0


def test_every_batch_stalling_is_period_one():
    rng = np.random.default_rng(3)
    waits = 0.05 * rng.lognormal(0, 0.1, 600)
    got = stall_period(trace_of(events_from_waits(waits)))
    assert got.period_steps == 1


def test_spikes_above_a_continuous_stall_still_show_their_period():
    rng = np.random.default_rng(4)
    waits = 0.05 * rng.lognormal(0, 0.1, 600)
    waits[::5] = 0.5
    assert stall_period(trace_of(events_from_waits(waits))).period_steps == 5


@pytest.mark.parametrize("workers", [2, 3, 6])
def test_too_few_workers_stall_every_num_workers_batches(workers):
    # each worker takes 1.5 x workers x compute: the loader is a third too slow
    ev, _ = simulated(workers, workers, load=0.15 * workers, compute=0.1)
    got = stall_period(trace_of(ev, workers=workers))
    assert got.period_steps == workers
    assert got.period_seconds == pytest.approx(0.15 * workers, rel=0.15)


def test_period_of_small_inputs():
    assert period_of([]) == (0, 0.0)
    assert period_of([3, 6, 9]) == (0, 0.0)  # fewer than four events: no claim
    assert period_of([3, 4, 8, 9, 13, 14, 18, 23])[0] == 5  # two-batch stalls count once
