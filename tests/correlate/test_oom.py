"""memory_limit scored from the workers' OOM kills in the window (correlate/oom.py)."""
import numpy as np

from stallscope.correlate import oom
from stallscope.correlate.trace import RankTrace, Series

S = 10**9


def trace(kill_at_s=None):
    # 100 batches of 0.2 s: 10 ms waits, and 1 s waits from 12 s on (the loader restarting)
    t = np.cumsum(np.full(100, S // 5))
    wait = np.where(t >= 12 * S, S // 2, S // 100).astype(np.int64)
    ev = np.stack([t, wait, np.full(100, S // 5)], 1)
    ts = np.arange(1, 21, dtype=np.int64) * S
    v = np.zeros(len(ts))
    if kill_at_s is not None:
        v[ts == kill_at_s * S] = 1
    return RankTrace.from_events({}, {"num_workers": 2}, ev, {oom.OOM_KILLED: Series(ts, v)})


def test_the_wait_from_the_kill_on_is_the_kills():
    r = oom.score(trace(kill_at_s=12))
    after = trace().wait[trace().t_end > 11 * S].sum() / trace().wait.sum()
    assert r["cause"] == "memory_limit" and r["score"] == round(after, 4) and r["score"] > 0.9
    assert r["evidence"][0]["during_stalls"] == 1


def test_no_kill_scores_nothing_and_no_signal_is_not_evaluated():
    assert oom.score(trace())["score"] == 0.0
    t = trace()
    t.signals = {}
    assert oom.score(t) is None
