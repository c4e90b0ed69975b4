import numpy as np

from stallscope.correlate.period import dominant_period, stall_period
from stallscope.correlate.sawtooth import sawtooth
from stallscope.lab import synth
from tests.helpers.correlate import simulated, trace_of


def shifted(samples, seconds):
    return [[t + int(seconds * synth.SEC), v] for t, v in samples]


def test_gpu_dips_line_up_with_the_loader_cadence():
    ev, ph = simulated(1, 4, load=0.8, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, gpu=synth.gpu_samples(ph, s, e))
    per = stall_period(tr)
    got = sawtooth(tr, per.period_seconds)
    assert got.score > 0.9 and abs(got.lag_seconds) <= 0.1
    assert got.period_match is True
    assert abs(got.gpu_period_seconds - per.period_seconds) < 0.2 * per.period_seconds


def test_lag_between_hook_clock_and_gpu_sampler_is_found():
    ev, ph = simulated(2, 4, load=0.8, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, gpu=shifted(synth.gpu_samples(ph, s, e), 0.3))
    got = sawtooth(tr)
    assert got.score > 0.8
    assert abs(got.lag_seconds - 0.3) <= 0.1


def test_unrelated_gpu_activity_scores_low():
    ev, _ = simulated(3, 4, load=0.8, compute=0.1)
    s, e = synth.span_of(ev)
    rng = np.random.default_rng(0)
    noise = [[t, float(v)] for (t, _), v in zip(synth.sampled(lambda t: 0, s, e, every=0.1),
                                                rng.uniform(0.3, 1.0, 100000))]
    assert sawtooth(trace_of(ev, gpu=noise)).score < 0.2


def test_no_or_flat_gpu_signal():
    ev, _ = simulated(4, 4, load=0.8, compute=0.1)
    s, e = synth.span_of(ev)
    none = sawtooth(trace_of(ev))
    assert none.score is None and "no GPU" in none.note
    flat = sawtooth(trace_of(ev, gpu=synth.sampled(lambda t: 1.0, s, e, every=0.1)))
    assert flat.score == 0.0


def test_coarse_gpu_samples_are_called_out():
    ev, ph = simulated(5, 2, load=0.3, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, gpu=synth.gpu_samples(ph, s, e, every=1.0))
    got = sawtooth(tr, stall_period(tr).period_seconds)
    assert "too coarse" in got.note


def test_dominant_period():
    x = np.tile([1.0, 0, 0, 0, 0, 0, 0], 40)
    assert dominant_period(x) == 7
    assert dominant_period(np.ones(100)) == 0


def test_nothing_to_line_up_without_stalls():
    ev, ph = simulated(6, 4, load=0.1, compute=0.1)
    s, e = synth.span_of(ev)
    tr = trace_of(ev, gpu=synth.gpu_samples(ph, s, e))
    got = sawtooth(tr, 0.0, stall_batches=stall_period(tr).stall_batches)
    assert got.score is None and "no stalls" in got.note
