"""The cause ranking as a declared list of named steps (issue 49, item 4): nothing
reorders the scores outside STEPS, every step says why it is where it is, and one
analysis computes each derived measure once."""
import collections

import numpy as np
import pytest

from stallscope.correlate import budget, diagnosis, transfer, workers
from tests.correlate.test_budget import _steady_slow_mount


def test_every_step_is_named_once_with_its_reason_and_the_measured_floor_comes_last():
    names = [s.name for s in diagnosis.STEPS]
    assert len(names) == len(set(names))
    assert all(len(s.reason) > 40 for s in diagnosis.STEPS)
    assert names[-1] == "measured"
    # too_few_workers is the remainder of what every other cause and mechanism explains
    assert names.index("too_few_workers") > max(names.index(n) for n in
                                                ("signals", "computed", "standing", "budget"))


def test_rank_causes_runs_the_declared_steps_in_order(monkeypatch):
    ran = []
    steps = tuple(diagnosis.Step(s.name, (lambda st, s=s: (ran.append(s.name), s.run(st))[1]), s.reason)
                  for s in diagnosis.STEPS)
    monkeypatch.setattr(diagnosis, "STEPS", steps)
    d = diagnosis.analyse(_steady_slow_mount())
    assert d.verdict == "input_bound"
    assert ran == [s.name for s in steps]


@pytest.mark.parametrize("measure", [(transfer, "split"), (workers, "runnable_split"),
                                     (workers, "busy_share"), (budget, "account")])
def test_one_analysis_computes_each_measure_once(monkeypatch, measure):
    module, name = measure
    calls = collections.Counter()
    real = getattr(module, name)

    def counted(*a, **k):
        calls[name] += 1
        return real(*a, **k)
    monkeypatch.setattr(module, name, counted)
    tr = _steady_slow_mount()
    d = diagnosis.analyse(tr)
    assert d.verdict == "input_bound" and d.budget is not None
    assert calls[name] == 1, calls


def test_the_budget_the_diagnosis_carries_is_the_one_the_causes_were_scored_on():
    tr = _steady_slow_mount()
    d = diagnosis.analyse(tr)
    store = d.cause("storage_latency")
    row = next(e for e in store.evidence if e.signal.startswith("time_budget"))
    assert row.during_stalls == pytest.approx(d.budget.share_of("storage_latency"), abs=1e-4)
    assert np.isclose(sum(c.share for c in d.budget.components), 1.0, atol=0.01)
