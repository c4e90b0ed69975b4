"""correlate/epochs.py: steady causes are put on the same base as epoch_start's."""
import pytest

from stallscope.correlate import causes, epochs
from tests.helpers.correlate import cause


def _cause(name, score):
    return cause(name, score, "s.")


def test_a_steady_cause_explains_only_the_steady_share_of_the_wait():
    # 87 % of the wait at iterator starts; transfer_cost explains 99 % of the steady 13 %
    started = _cause("epoch_start", 0.87)
    out = epochs.steady_part([_cause("transfer_cost", 0.99)], started)
    assert out[0].score == pytest.approx(0.99 * 0.13, abs=1e-4)
    assert "13% of the wait" in out[0].summary
    ranked = causes.rank_causes(out + [started])
    assert ranked[0].cause == "epoch_start"


def test_the_runs_own_start_leaves_the_scores_as_they_are():
    scored = [_cause("too_few_workers", 0.8)]
    assert epochs.steady_part(scored, _cause("epoch_start", 0.05)) == scored
