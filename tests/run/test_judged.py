"""How `stallscope run` judges a finished run (session.judged), on the rows it builds:
fewer batches than a verdict needs is "too short to judge"; a rank over the line only
by its first batch (the correlator's "starting") is judged on its other batches once
the run has ended, since its steps will never outweigh that start (issue 34)."""
from stallscope.run import session
from stallscope.run.outcome import RankRow
from stallscope.vocabulary import MIN_BATCHES
from tests.helpers.diagnose import report


def _doc(verdict="unknown", reason="Rank 0 is starting: ... Judged once its steps outweigh that start."):
    return report(verdict=verdict, reason=reason, rank=0, job="j", namespace=None)


def _row(batches, ratio, after_start=None, rank=0):
    return RankRow("j", rank, batches, ratio, data_wait_ratio_after_start=after_start)


def test_too_few_batches_is_too_short_to_judge():
    doc, short = session.judged(_doc("input_bound", "waits 40%"), [_row(MIN_BATCHES - 1, 0.4)])
    assert doc.verdict == "unknown" and short
    assert doc.reason.startswith("too short to judge: %d batches" % (MIN_BATCHES - 1))
    assert "Run at least %d batches" % MIN_BATCHES in doc.next_steps[0].step


def test_a_start_only_wait_of_a_finished_run_is_healthy():
    doc, short = session.judged(_doc(), [_row(45, 0.029, 0.019)])
    assert doc.verdict == "healthy" and not short, doc.reason
    assert "2.9%" in doc.reason and "1.9%" in doc.reason and "judged once" not in doc.reason
    assert doc.next_steps[0].step.startswith("Nothing to do")


def test_an_unknown_for_another_reason_stays_unknown():
    # another rank over the line on its own: not a start-only wait, left as diagnose says
    rows = [_row(45, 0.029, 0.019), _row(45, 0.3, 0.3, rank=1)]
    assert session.judged(_doc(), rows)[0].verdict == "unknown"
    # no split of the start: nothing says the wait was the start's
    assert session.judged(_doc(), [_row(45, 0.029, None)])[0].verdict == "unknown"
    # a verdict diagnose gave is kept
    assert session.judged(_doc("input_bound", "waits"), [_row(45, 0.4, 0.4)])[0].verdict == "input_bound"
