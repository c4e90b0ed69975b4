"""Batch events as columns from the wire to the correlator (issue 29): the rank table's
timeline keeps what validation handed on, serves a window as contiguous columns, and
the correlator's trace built from them equals the one built from rows."""
import numpy as np

from stallscope.agent.table.batches import BatchColumns, BatchTimeline
from stallscope.correlate.trace import RankTrace


def columns(t0, n, ready=None):
    t = np.arange(t0, t0 + n, dtype=np.int64) * 10
    return BatchColumns(t, t % 7, t % 7 + 3, ready)


def test_the_timeline_keeps_columns_and_serves_a_window_as_contiguous_columns():
    tl = BatchTimeline(8)
    tl.extend(columns(0, 5, ready=np.arange(5, dtype=np.int64)))
    tl.extend(columns(5, 6))  # wraps: the oldest three go; no split: ready -1
    assert len(tl) == 8
    got = tl.since(40)
    assert got.t_end.tolist() == [40, 50, 60, 70, 80, 90, 100]
    assert got.ready.tolist() == [4, -1, -1, -1, -1, -1, -1]
    assert got.wait.tolist() == (got.t_end % 7).tolist()
    assert got.interval.tolist() == (got.t_end % 7 + 3).tolist()
    for c in (got.t_end, got.wait, got.interval, got.ready):  # ready for the correlator as they are
        assert c.dtype == np.int64 and c.ndim == 1 and c.flags["C_CONTIGUOUS"]
    assert tl.newest() == (100, 100 % 7, 100 % 7 + 3)
    assert tl.rows()[:, 0].tolist() == list(range(30, 110, 10))
    assert BatchTimeline(4).newest() is None
    small = BatchTimeline(4)
    small.extend(columns(0, 10))  # more than it holds at once: the newest 4
    assert small.since(0).t_end.tolist() == [60, 70, 80, 90] and small.since(75).t_end.tolist() == [80, 90]


def test_a_trace_from_columns_equals_the_trace_from_rows():
    c = columns(100, 50, ready=np.full(50, 2, np.int64))
    order = np.random.default_rng(1).permutation(50)  # out of order: both sort alike
    shuffled = BatchColumns(c.t_end[order], c.wait[order], c.interval[order], c.ready[order])
    a = RankTrace.from_columns({}, None, shuffled.t_end, shuffled.wait, shuffled.interval, shuffled.ready)
    b = RankTrace.from_events({}, None, shuffled.rows(ready=True))
    for field in ("t_end", "wait", "interval", "ready"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist(), field
    assert a.t_end.tolist() == sorted(c.t_end.tolist())
    unsplit = RankTrace.from_columns({}, None, c.t_end, c.wait, c.interval)
    assert unsplit.ready.tolist() == [-1] * 50


def test_rows_from_a_message_built_in_code_become_columns():
    got = BatchColumns.of([[10, 1, 5], [20, 2, 10]])
    assert (got.t_end.tolist(), got.wait.tolist(), got.interval.tolist(), got.ready) == (
        [10, 20], [1, 2], [5, 10], None)
    assert BatchColumns.of(got) is got
    assert len(BatchColumns.of([])) == 0
    assert np.asarray(got).tolist() == [[10, 1, 5], [20, 2, 10]]  # what the simulated GPU reads
