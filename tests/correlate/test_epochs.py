"""correlate/epochs.py: steady causes are put on the same base as epoch_start's."""
import pytest

from stallscope.correlate import causes, epochs
from tests.helpers.correlate import cause


def _cause(name, score):
    return cause(name, score, "s.")


def test_a_steady_cause_explains_only_the_steady_share_of_the_wait():
    # 87 % of the wait at iterator starts; transfer_cost explains 99 % of the steady 13 %
    started = _cause("epoch_start", 0.87)
    out = epochs.steady_part([_cause("transfer_cost", 0.99)], started.score)
    assert out[0].score == pytest.approx(0.99 * 0.13, abs=1e-4)
    assert "13% of the wait" in out[0].summary
    ranked = causes.rank_causes(out + [started])
    assert ranked[0].cause == "epoch_start"


def test_the_runs_own_start_leaves_the_scores_as_they_are():
    scored = [_cause("too_few_workers", 0.8)]
    assert epochs.steady_part(scored, 0.05) == scored


def _stall_from_the_run_start(first_batch_known):
    """A rank with too few workers from its first batch, whose workers took 8 s to start:
    the start holds about half of the window's wait."""
    from stallscope.correlate import diagnosis
    from tests.helpers.correlate import simulated, trace_of
    events, _ = simulated(3, 2, load=0.5, compute=0.1, n=60, extra=lambda k, t: 8.0 if k == 0 else 0.0)
    t = trace_of(events, workers=2)
    assert t.interval[0] == t.wait[0]  # the hook's mark of an iterator's first batch
    if first_batch_known:
        t.first_batch_ns = int(t.t_end[0])
    return diagnosis.analyse(t, [t]), t


def test_the_runs_own_start_is_no_epoch_start():
    """issue 49: a stall that began with the run, analysed while the window held the run's
    first batch, was published as epoch_start (a drawn CFS-quota stall: 0.69). Its workers
    start once whatever the epochs do: with the agent's first batch of the process known,
    that start is left out, and the steady cause is named at its full score; where the
    first batch is not known (an agent started after the job), it is an iterator start
    like any other."""
    known, t = _stall_from_the_run_start(True)
    start_share = float(t.wait[0]) / float(t.wait.sum())
    assert 0.3 < start_share < 0.7, start_share
    assert known.verdict == "input_bound"
    assert known.causes[0].cause == "too_few_workers", [(c.cause, c.score) for c in known.causes]
    assert "epoch_start" not in [c.cause for c in known.causes]
    unknown, _ = _stall_from_the_run_start(False)
    scores = {c.cause: c.score for c in unknown.causes}
    assert scores["epoch_start"] == pytest.approx(start_share, abs=0.01), scores
