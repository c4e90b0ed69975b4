"""Set-up checks (issue 32, item 3): each fires on its own case, with the number that
makes it wrong, and none fires on a healthy set-up; what is not known is not judged."""
import dataclasses

import numpy as np
import pytest

from stallscope import vocabulary
from stallscope.correlate import checks, codec, diagnosis
from stallscope.correlate.facts import RankFacts
from stallscope.correlate.trace import RankTrace

MiB = 1 << 20
HEALTHY_LOADER = {"num_workers": 4, "prefetch_factor": 2, "pin_memory": True,
                  "persistent_workers": True, "batch_size": 64, "batch_bytes": 4 * MiB}
# a GPU rank on a 6-core integer quota with a 64 MiB /dev/shm (4 x 2 x 4 MiB = 32 MiB needed)
HEALTHY = checks.SetUp(HEALTHY_LOADER, gpu=True, cpu_limit_cores=6.0, quota_measured=True,
                       shm_size_bytes=64 * MiB, wants_pinned=True, epoch_seconds=30.0,
                       startup_seconds=2.0)


def _with(loader=None, **setup):
    return dataclasses.replace(HEALTHY, loader=dict(HEALTHY_LOADER, **(loader or {})), **setup)


CASES = {
    "no_workers_with_gpu": (_with({"num_workers": 0}), 0, 1),
    "shm_too_small": (_with({"batch_bytes": 3 * MiB}, shm_size_bytes=16 * MiB), 16 * MiB, 24 * MiB),
    "workers_over_quota": (_with({"num_workers": 8}, shm_size_bytes=1 << 30), 8, 6.0),
    "fractional_cpu_limit": (_with(cpu_limit_cores=5.5), 5.5, 6),
    "pin_memory_off_with_gpu": (_with({"pin_memory": False}), False, True),
    "workers_restart_each_epoch": (_with({"persistent_workers": False}, epoch_seconds=1.5,
                                         startup_seconds=4.0), 1.5, 4.0),
}


def test_every_declared_check_has_a_case_here():
    assert set(CASES) == {c.name for c in vocabulary.CHECKS}


def test_a_healthy_set_up_warns_of_nothing_and_judges_every_check():
    warned, unknown = checks.evaluate(HEALTHY)
    assert warned == () and unknown == ()


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_check_fires_alone_on_its_case_with_its_number(name):
    setup, value, line = CASES[name]
    warned, _ = checks.evaluate(setup)
    assert [w.check for w in warned] == [name]
    w = warned[0]
    assert w.value == value and w.line == line
    assert w.fix == vocabulary.check_of(name).fix and "<value>" not in w.text


def test_the_shm_line_is_workers_times_prefetch_times_the_batch():
    setup = _with({"num_workers": 3, "prefetch_factor": 4, "batch_bytes": 2 * MiB},
                  shm_size_bytes=23 * MiB)
    (w,) = checks.evaluate(setup)[0]
    assert w.line == 3 * 4 * 2 * MiB and "24.0 MiB" in w.text and "23.0 MiB" in w.text
    assert checks.evaluate(dataclasses.replace(setup, shm_size_bytes=24 * MiB))[0] == ()


def test_what_is_not_known_is_not_judged():
    bare = checks.SetUp(dict(HEALTHY_LOADER, num_workers=0, pin_memory=False, batch_bytes=None,
                             persistent_workers=False))
    warned, unknown = checks.evaluate(bare)
    assert warned == ()
    # no GPU fact, no quota: those checks are unknown; no workers: nothing to size or restart
    assert set(unknown) == {"no_workers_with_gpu", "workers_over_quota", "fractional_cpu_limit",
                            "pin_memory_off_with_gpu"}
    assert checks.evaluate(checks.SetUp(None))[1] == tuple(c.name for c in vocabulary.CHECKS)


def test_no_quota_is_no_limit():
    warned, unknown = checks.evaluate(_with({"num_workers": 64}, cpu_limit_cores=None,
                                            shm_size_bytes=1 << 40))
    assert warned == () and unknown == ()


def _trace(starts_every, n=30, wait_ns=200_000, startup_ns=3_000_000_000, step_ns=10_000_000):
    """Batches of step_ns with an iterator start (interval == wait) every starts_every."""
    t, ends, waits, intervals = 10 * 10**9, [], [], []
    for i in range(n):
        first = i % starts_every == 0
        w = startup_ns if first else wait_ns
        t += w if first else step_ns
        ends.append(t)
        waits.append(w)
        intervals.append(w if first else step_ns)
    return np.array(ends), np.array(waits), np.array(intervals)


def test_epochs_are_measured_from_the_iterator_starts():
    ends, waits, intervals = _trace(10)
    tr = RankTrace.from_events({"job": "j", "rank": 0}, dict(HEALTHY_LOADER),
                               np.stack([ends, waits, intervals], 1).tolist(), {}, {})
    epoch, startup = checks.epochs(tr)
    assert startup == pytest.approx(3.0)
    assert epoch == pytest.approx(9 * 0.01, rel=1e-6)  # 9 steps of 10 ms after each first batch


def test_the_diagnosis_carries_the_warnings_at_the_first_batch_and_through_the_codec():
    ends, waits, intervals = _trace(10, n=3)  # 3 batches: far too few for a verdict
    loader = dict(HEALTHY_LOADER, num_workers=0, pin_memory=False)
    tr = RankTrace.from_events({"job": "j", "rank": 0, "pod": "p"}, loader,
                               np.stack([ends, waits, intervals], 1).tolist(), {}, {})
    facts = RankFacts(setup=dataclasses.replace(HEALTHY, loader=None))
    d = diagnosis.analyse(tr, [tr], node="n", facts=facts)
    assert d.verdict == "unknown"
    assert {w.check for w in d.warnings} == {"no_workers_with_gpu", "pin_memory_off_with_gpu"}
    back = codec.decode(codec.encode(d))
    assert back.warnings == d.warnings and back.checks_unknown == d.checks_unknown
