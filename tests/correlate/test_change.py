"""correlate/change.py on a built trace: where before ends and after begins."""
import numpy as np
import pytest

from stallscope.correlate import change
from stallscope.correlate.model import Stats, WatchedSettings


class Trace:
    def __init__(self, interval_ms, wait_ms):
        self.interval = np.asarray(interval_ms, np.int64) * 1_000_000
        self.wait = np.asarray(wait_ms, np.int64) * 1_000_000
        self.t_end = np.cumsum(self.interval)
        self.n = len(self.interval)


def test_after_starts_past_the_new_workers_first_round_not_at_the_agents_last_look():
    # 20 batches of 80 ms waiting 40 (2 workers too few), then a new iterator with 4 workers:
    # its first batch waits 500 ms (interval == wait), its first round 3 more batches wait
    # 30 ms (workers still starting), then 20 steady batches of 40 ms without a wait
    old = [(80, 40)] * 20
    new = [(500, 500)] + [(70, 30)] * 3 + [(40, 0)] * 20
    t = Trace(*zip(*(old + new)))
    # the agent looked last 5 batches before the change
    marked = change.mark(WatchedSettings(num_workers=2), WatchedSettings(num_workers=4),
                         int(t.t_end[14]), None)
    out = change.view(marked, t)
    assert out.before == Stats(20, pytest.approx(0.5), 0.08)
    assert out.after == Stats(20, 0.0, 0.04)
    assert out.stall_gone is True


def test_without_an_iterator_start_the_mark_divides():
    # a CPU quota changed under the same iterator: no new first batch to find
    t = Trace([80] * 10 + [40] * 10, [40] * 10 + [0] * 10)
    marked = change.mark(WatchedSettings(cpu_quota_cores=0.4), WatchedSettings(cpu_quota_cores=1.0),
                         int(t.t_end[9]), None)
    out = change.view(marked, t)
    assert out.before.batches == 10 and out.after.data_wait_ratio == 0.0
