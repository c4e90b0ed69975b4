"""The detector's per-second bins, kept as reports come (issue 15): the agent's test on
them says exactly what the whole test says on the rank's timeline, whatever order and
size the reports came in, and a batch with a bad date cannot evict real seconds."""
import dataclasses
import time
import types

import numpy as np
import pytest

from stallscope.agent.table import rankstate
from stallscope.agent.table.state import RankTable
from stallscope.correlate.detect import detect, judge
from stallscope.correlate.trace import RankTrace
from stallscope.correlate.waitbins import BIN_NS, HORIZON_BINS, WaitBins
from stallscope.lab import synth
from tests.correlate.test_detect import loop
from tests.helpers.correlate import report

SEC = synth.SEC


def whole(events, now):
    return detect(RankTrace.from_events({}, None, events[events[:, 0] <= now]), now)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_the_agents_bins_say_what_the_whole_test_says_every_half_second(share, monkeypatch):
    events = loop(share, seed=5)
    table = RankTable(max_ranks=4, timeline_seconds=900)
    sent = 0
    flagged = 0
    clock = [0]
    # the agent bins a report against its own clock (batches ahead of it are dropped): the
    # replay's clock, not this machine's uptime, which may be shorter than the replay
    monkeypatch.setattr(rankstate, "time", types.SimpleNamespace(monotonic_ns=lambda: clock[0],
                                                                  monotonic=lambda: clock[0] / 1e9))
    for now_s in np.arange(12.0, events[-1, 0] / SEC, 0.5):
        now = clock[0] = int(now_s * SEC)
        upto = int(np.searchsorted(events[:, 0], now, side="right"))
        if upto > sent:  # one report a half second, as the hook flushes
            rank = table.apply(report("j", 0, "p", events[sent:upto].tolist()))
            sent = upto
        got = judge(*table.detection_input(rank, now), now)
        want = whole(events, now)
        assert got == want, now_s
        flagged += got.stalled
    assert (flagged > 0) == (share > 0)  # the comparison saw stalls where there were some


def test_a_call_blocked_in_next_counts_as_the_timeline_has_it():
    # dated a minute ago: the timeline the whole test reads is the agent's last seconds
    t0 = time.monotonic_ns() - 60 * SEC
    ev, _ = synth.simulate(300, 2, lambda k, t: 0.05, lambda k, t: 0.1, t0=t0)
    ev = np.array(ev, np.int64)
    table = RankTable(max_ranks=4, timeline_seconds=900)
    rank = table.apply(report("j", 0, "p", ev.tolist()))
    began = int(ev[-1, 0]) + int(0.1 * SEC)
    for blocked_s in (3.0, 6.0):
        blocked = int(blocked_s * SEC)
        table.apply(dataclasses.replace(report("j", 0, "p", []), mono_ns=began + blocked,
                                        blocked_since_ns=began))
        now = began + blocked + SEC // 2
        got = judge(*table.detection_input(rank, now), now)
        tl = table.timeline(rank, 900, True)
        assert got == detect(RankTrace.from_columns({}, None, tl.t_end, tl.wait, tl.interval, tl.ready), now)
        assert got.stalled is (blocked_s > 5), got
    assert got.since_ns == began


def test_reports_out_of_order_and_split_anyhow_give_the_same_bins():
    events = loop(0.3, seed=9)
    now = int(events[-1, 0])
    one = WaitBins.of_events(events[:, 0], events[:, 1], events[:, 2], now)
    rng = np.random.default_rng(2)
    cuts = np.sort(rng.choice(np.arange(1, len(events)), 40, replace=False))
    chunks = np.split(events, cuts)
    order = rng.permutation(len(chunks))
    many = WaitBins()
    for i in order:
        c = chunks[i]
        many.add(c[:, 0], c[:, 1], c[:, 2], now)
    a, b = one.window(now), many.window(now)
    assert a.first == b.first
    np.testing.assert_allclose(a.wait, b.wait)
    np.testing.assert_allclose(a.step, b.step)
    np.testing.assert_array_equal(a.count, b.count)
    inside = events[:, 0] // BIN_NS > now // BIN_NS - HORIZON_BINS
    assert a.batches == int((events[inside, 2] != events[inside, 1]).sum())  # starts left out


def test_seconds_past_the_horizon_leave_and_bad_dates_evict_nothing():
    bins = WaitBins()
    t = np.arange(1000, 1000 + HORIZON_BINS + 50) * BIN_NS  # one batch a second
    ones = np.full(len(t), BIN_NS // 2)
    now = int(t[-1])
    bins.add(t, ones, 2 * ones, now)
    w = bins.window(now)
    assert len(w) == HORIZON_BINS and w.first == t[-HORIZON_BINS] // BIN_NS
    assert w.batches == HORIZON_BINS
    # a batch a day ahead of the agent's clock, and one older than the ring: not binned
    bins.add(np.array([now + 86400 * BIN_NS, int(t[0])]), np.array([1, 1]), np.array([2, 2]), now)
    assert bins.window(now).batches == HORIZON_BINS
    np.testing.assert_allclose(bins.window(now).wait, 0.5)
    # a month of seconds in one report: the newest ring's worth is binned, no more
    fresh = WaitBins()
    far = np.arange(now // BIN_NS - 30 * 86400, now // BIN_NS + 1) * BIN_NS
    fresh.add(far, np.full(len(far), 7), np.full(len(far), 9), now)
    assert fresh.window(now).batches == HORIZON_BINS
    assert sorted(fresh.ids) == list(range(now // BIN_NS - HORIZON_BINS, now // BIN_NS + 1))
