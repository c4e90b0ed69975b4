"""base.WorkerCounters: one counter per rank over its changing workers, from the
readings a collection makes (generations replaced, PIDs reused, a worker gone)."""
import types

import pytest

from stallscope.exporters import base


def counters(before_first):
    clock = [100.0]
    host = types.SimpleNamespace(clock=lambda: clock[0])
    return base.WorkerCounters(host, width=2, before_first=before_first), clock


@pytest.mark.parametrize("before_first", [False, True])
def test_generations_sum_into_one_counter_that_only_grows(before_first):
    c, clock = counters(before_first)
    got = c.update("r0", [(11, 5, (10.0, 1.0)), (12, 6, (20.0, 2.0))])
    first = (30.0, 3.0) if before_first else (0.0, 0.0)
    assert got == base.Counted(first, first, None)
    clock[0] += 2.0
    got = c.update("r0", [(11, 5, (15.0, 1.0)), (12, 6, (26.0, 4.0))])
    assert got == base.Counted((first[0] + 11, first[1] + 2), (11.0, 2.0), 2.0)
    # the epoch ends: 11 and 12 go, a new generation (13) started since: all of it counts
    clock[0] += 1.0
    got = c.update("r0", [(13, 9, (4.0, 0.5))])
    assert got == base.Counted((first[0] + 15, first[1] + 2.5), (4.0, 0.5), 1.0)
    # PID 13 reused by another worker (another start time): counted from 0, not as 1 - 4
    clock[0] += 1.0
    got = c.update("r0", [(13, 10, (1.0, 0.0))])
    assert got.moved == (1.0, 0.0) and got.total == (first[0] + 16, first[1] + 2.5)


def test_without_a_start_time_a_counter_that_went_back_is_a_new_process():
    c, clock = counters(False)
    c.update("r0", [(7, None, (100.0, 10.0))])
    clock[0] += 1.0
    assert c.update("r0", [(7, None, (130.0, 10.0))]).moved == (30.0, 0.0)
    clock[0] += 1.0
    assert c.update("r0", [(7, None, (5.0, 1.0))]).moved == (5.0, 1.0)
    assert c.total("r0") == (35.0, 1.0)


def test_ranks_are_apart_and_forgotten_when_gone():
    c, clock = counters(True)
    c.update("r0", [(7, 1, (3.0, 0.0))])
    c.update("r1", [(7, 1, (5.0, 0.0))])  # the same PID in another rank's pod
    clock[0] += 1.0
    assert c.update("r1", [(7, 1, (6.0, 0.0))]).moved == (1.0, 0.0)
    c.prune(["r1"])
    assert not c.knows("r0") and c.total("r0") is None and c.total("r1") == (6.0, 0.0)
    # a rank seen again starts afresh: a new first collection
    assert c.update("r0", [(7, 1, (4.0, 0.0))]).seconds is None


def test_pod_totals_sum_ranks_keep_what_an_ended_rank_counted_and_forget_empty_pods():
    def rank(pod, r):
        return types.SimpleNamespace(labels=dict(job="j", rank=str(r), pod=pod, namespace="ns", node="n"))

    totals = base.PodTotals(width=2)
    totals.add(rank("a", 0), (1.0, 2.0))
    totals.add(rank("a", 1), (3.0, 0.0))
    totals.add(rank("b", 2), (5.0, 5.0))
    [(pod_a, a), (pod_b, b)] = totals.rows()
    assert "a" in pod_a and "b" in pod_b and a == (4.0, 2.0) and b == (5.0, 5.0)
    totals.add(rank("a", 1), (1.0, 1.0))  # rank 0 ended: what it counted stays; b has no rank left
    assert [t for _p, t in totals.rows()] == [(5.0, 3.0)]
