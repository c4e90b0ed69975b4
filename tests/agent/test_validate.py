"""Every hook message is untrusted: malformed and hostile ones are rejected by reason and
the agent keeps running."""
import json
import random
import time

import numpy as np
import pytest

from stallscope.agent.table import ingest, state, validate
from stallscope.hook import wire
from stallscope.host.report import StepPhases


def good(t0=None, **over):
    """A valid report. Times given (events' t_end, mono_ns, blocked_since_ns) count from a
    moment two minutes ago (or ``t0``), so the agent's clock bounds hold whenever the test
    runs."""
    t0 = time.monotonic_ns() - 120 * 10**9 if t0 is None else t0
    msg = {"v": 1, "kind": "report", "pid": 1234, "role": "main", "mono_ns": 10, "wall_ns": time.time_ns(),
           "dropped_total": 0,
           "id": {"job": "j", "rank": 0, "local_rank": 0, "world_size": 2, "pod": "p",
                  "namespace": "ns", "node": "n"},
           "events": [[1_000_000, 100, 200], [2_000_000, 50, 1_000_000]],
           "loader": {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False,
                      "persistent_workers": False, "batch_size": 4, "worker_pids": [11, 12]}}
    msg.update(over)
    def shift(v):
        return (v + t0 if type(v) is int and v >= 0 else v)
    if isinstance(msg["events"], list):
        msg["events"] = [[shift(e[0])] + e[1:] if isinstance(e, list) and e else e for e in msg["events"]]
    for key in ("mono_ns", "blocked_since_ns"):
        if key in msg:
            msg[key] = shift(msg[key])
    return json.dumps(msg).encode()


def v2(events, n=None, wait=10**6, ready=None, **over):
    """A version 2 message: the JSON header, then ``events`` as three int64 columns, and
    a fourth, ``ready`` (the ready waits), when given (the header says ``cols``: 4 unless
    ``cols`` is given)."""
    import array

    now = time.monotonic_ns()
    ends = [now - (events - i) * 10**8 for i in range(events)]
    head = json.loads(good(**over))
    head.pop("events")
    head.update(v=2, n=events if n is None else n, mono_ns=now)
    if ready is not None:
        head.setdefault("cols", 4)
    cols = array.array("q", ends) + array.array("q", [wait] * events) + array.array("q", [10**8] * events)
    if ready is not None:
        cols += array.array("q", ready)
    return json.dumps(head).encode() + b"\n" + cols.tobytes()


def test_version_2_carries_events_as_binary_columns():
    ev = validate.parse(v2(3)).events
    assert len(ev) == 3 and ev.wait.tolist() == [10**6] * 3 and ev.interval.tolist() == [10**8] * 3
    # handed on as the wire's columns: each a contiguous int64 column, none transposed
    assert all(c.dtype == np.int64 and c.flags["C_CONTIGUOUS"] for c in (ev.t_end, ev.wait, ev.interval))
    assert ev.t_end.base is not None and ev.t_end.base is ev.interval.base  # views of the report's block
    with pytest.raises(validate.Reject) as e:
        validate.parse(v2(2, wait=2 * 10**8))  # wait longer than its interval
    assert e.value.reason == "bad_schema"
    assert len(validate.parse(v2(0)).events) == 0


def test_the_ready_wait_column_is_read_and_checked():
    msg = validate.parse(v2(3, ready=[0, 4 * 10**5, 10**6]))
    assert len(msg.events) == 3 and msg.events.ready.tolist() == [0, 4 * 10**5, 10**6]
    assert validate.parse(v2(3)).events.ready is None   # three columns: no split
    assert validate.parse(good()).events.ready is None  # version 1: no split
    assert len(validate.parse(v2(0, ready=[])).events.ready) == 0


@pytest.mark.parametrize("data,reason", [
    (v2(2, ready=[10, -1]), "bad_ready_wait"),            # negative
    (v2(2, ready=[10, 10**6 + 1]), "bad_ready_wait"),     # longer than its wait
    (v2(2, ready=[10, 2**63 - 1]), "bad_ready_wait"),
    (v2(2, ready=[10, 10], role="worker"), "bad_ready_wait"),  # a worker's events have none
    (v2(2, ready=[10]), "bad_schema"),                    # a short fourth column
    (v2(2, ready=[10, 10], cols=3), "bad_schema"),        # a block longer than 3 columns
    (v2(2, cols=4), "bad_schema"),                        # 4 columns said, 3 sent
    (v2(2, ready=[10, 10], cols=5), "bad_schema"),
    (v2(2, ready=[10, 10], cols="4"), "bad_schema"),
    (v2(2, ready=[10, 10], cols=True), "bad_schema"),
])
def test_a_malformed_ready_wait_is_refused_with_a_reason(data, reason):
    with pytest.raises(validate.Reject) as e:
        validate.parse(data)
    assert e.value.reason == reason


def test_the_ingest_counts_a_bad_ready_wait_and_keeps_the_rank_unharmed():
    table = state.RankTable()
    ing = ingest_of(table)
    assert ing.handle(v2(2, ready=[10, 20]))
    assert not ing.handle(v2(2, ready=[10, -20]))
    assert dict(ing.stats.rejected) == {"bad_ready_wait": 1}
    rank = table.snapshot()[0]
    assert rank.wait.count == 2  # the refused report added nothing
    assert rank.timeline.rows()[:, 3].tolist() == [10, 20]
    assert ing.handle(v2(1))  # a report without the split: -1 in the timeline
    assert rank.timeline.rows()[:, 3].tolist() == [10, 20, -1]


def ingest_of(table):
    return ingest.Ingest(sock=None, apply=table.apply, source_of=lambda pid, uid: None)


def test_good_message_parses():
    msg = validate.parse(good())
    assert msg.ident.rank == 0 and len(msg.events) == 2
    assert msg.loader.worker_pids == (11, 12)


def test_step_phases_parse_and_reach_the_ranks_api():
    phases = {"forward_ns": 5 * 10**8, "backward_ns": 14 * 10**8, "optimizer_ns": 10**8, "steps": 10}
    msg = validate.parse(good(phases=dict(phases, extra=1)))  # unknown keys are dropped
    assert msg.phases == StepPhases(**phases)
    assert validate.parse(good()).phases is None
    table = state.RankTable()
    assert ingest_of(table).handle(v2(2, phases=phases))
    rank = table.snapshot()[0]
    assert rank.as_json(time.monotonic())["phases"] == {
        "forward_seconds": 0.5, "backward_seconds": 1.4, "optimizer_seconds": 0.1, "steps": 10}


def _ident(**over):
    ident = {"job": "j", "rank": 0, "pod": "p", "namespace": "", "node": ""}
    ident.update(over)
    return ident


@pytest.mark.parametrize("data,reason", [
    (b"x" * (wire.MAX_MESSAGE_BYTES + 1), "oversize"),
    (b"\xff\xfe garbage", "bad_json"),
    (b"{", "bad_json"),
    (b"[" * 30000 + b"]" * 30000, "bad_json"),  # deep nesting must not crash the parser
    (b"[1,2,3]", "bad_schema"),
    (b'{"v": NaN}', "bad_json"),
    (good(v=3), "bad_version"),
    (good(v=1.0), "bad_version"),
    (good() + b"\n" + b"\0" * 24, "bad_json"),           # version 1 is one JSON object
    (v2(2, n=1), "bad_schema"),                        # a block of 2 events said to hold 1
    (v2(1, n=1001), "bad_schema"),
    (v2(1, n=-1), "bad_schema"),
    (good(kind="exec"), "bad_schema"),
    (good(role="root"), "bad_schema"),
    (good(pid=-1), "bad_schema"),
    (good(pid=True), "bad_schema"),
    (good(id="rank0"), "bad_schema"),
    (good(id=_ident(rank=-1)), "bad_schema"),
    (good(id=_ident(rank="0")), "bad_schema"),
    (good(id=_ident(rank=2 ** 40)), "bad_schema"),
    (good(id=_ident(job="")), "bad_label"),
    (good(id=_ident(job="a" * 129)), "bad_label"),
    (good(id=_ident(pod="evil\npod")), "bad_label"),
    (good(id=_ident(node=5)), "bad_schema"),
    (good(events="lots"), "bad_schema"),
    (good(events=[[1, 2]]), "bad_schema"),
    (good(events=[[1, -2, 3]]), "bad_schema"),
    (good(events=[[1, 2.5, 3]]), "bad_schema"),
    (good(events=[[1, 10, 3]]), "bad_schema"),  # wait longer than its interval
    (good(events=[[1, 2, 3]] * (wire.MAX_EVENTS_PER_MESSAGE + 1)), "bad_schema"),
    (good(events=[[1, 2, 2 ** 70]]), "bad_schema"),
    (good(loader=[1]), "bad_schema"),
    (good(loader={"num_workers": "2"}), "bad_schema"),
    (good(loader={"pin_memory": 1}), "bad_schema"),
    (good(loader={"worker_pids": list(range(1, 1000))}), "bad_schema"),
    (good(dropped_total=-5), "bad_schema"),
    (good(phases=[1]), "bad_schema"),
    (good(phases={"backward_ns": -1, "steps": 1}), "bad_schema"),
    (good(phases={"forward_ns": 1.5, "steps": 1}), "bad_schema"),
    (good(role="worker", phases={"steps": 1}), "bad_schema"),  # a trainer's only
    (b"", "empty"),
    # a lone surrogate, as a JSON escape and as the raw (invalid UTF-8) bytes ED A0 80:
    # accepted, it would make every later scrape fail to encode
    (good(id=_ident(job="\ud800")), "bad_label"),
    (good().replace(b'"job": "j"', b'"job": "\xed\xa0\x80"'), "bad_label"),
    (good(id=_ident(pod="zero\u200bwidth")), "bad_label"),
    (good(events=[[10**16, 0, 10**9]]), "bad_time"),   # 116 days ahead of the agent's clock
    (good(events=[[-10**14, 0, 1]]), "bad_schema"),
    (good(events=[[10, 0, 8 * 86400 * 10**9]]), "bad_time"),  # an interval of 8 days
    (good(mono_ns=2 ** 61), "bad_time"),
    (good(wall_ns=5), "bad_time"),
])
def test_rejects_with_reason(data, reason):
    with pytest.raises(validate.Reject) as e:
        validate.parse(data)
    assert e.value.reason == reason


def test_ingest_counts_rejects_and_enforces_the_rank_cap():
    table = state.RankTable(max_ranks=2)
    ing = ingest_of(table)
    assert ing.handle(good())
    assert ing.handle(good(id=_ident(rank=1)))
    assert not ing.handle(good(id=_ident(rank=2)))  # third rank: over the cap
    assert ing.handle(good(id=_ident(rank=1)))  # known ranks still report
    assert not ing.handle(b"nonsense")
    assert not ing.handle(good(v=9))
    assert dict(ing.stats.rejected) == {"rank_limit": 1, "bad_json": 1, "bad_version": 1}
    assert ing.stats.accepted == 3 and ing.stats.events == 6
    assert len(table.ranks) == 2


def test_ingest_never_raises_on_random_input():
    rng = random.Random(1234)
    table = state.RankTable()
    ing = ingest_of(table)
    base = good()
    for _ in range(3000):
        kind = rng.random()
        if kind < 0.4:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        else:  # mutate a valid message: flip, cut or splice bytes
            b = bytearray(base)
            for _ in range(rng.randrange(1, 6)):
                i = rng.randrange(len(b))
                b[i] = rng.randrange(256)
            data = bytes(b[: rng.randrange(1, len(b) + 1)]) if kind < 0.7 else bytes(b)
        ing.handle(data)
    assert ing.stats.accepted + sum(ing.stats.rejected.values()) == 3000
    assert "internal_error" not in ing.stats.rejected


def test_histograms_and_timeline_from_events():
    table = state.RankTable()
    ing = ingest_of(table)
    events = [[i * 10_000_000, 5_000_000, 10_000_000] for i in range(1, 11)]
    assert ing.handle(good(events=events))
    rank = table.snapshot()[0]
    assert rank.wait.count == 10 and rank.wait.sum_ns == 50_000_000
    assert rank.step.sum_ns == 100_000_000
    # 5 ms falls in the (2 ms, 10 ms] bucket, 10 ms in (2 ms, 10 ms] as well (le is inclusive)
    cum = dict(rank.wait.cumulative())
    assert cum["0.002"] == 0 and cum["0.01"] == 10 and cum["+Inf"] == 10
    assert len(rank.timeline) == 10


def test_dropped_counter_survives_process_restarts():
    table = state.RankTable()
    ing = ingest_of(table)
    ing.handle(good(dropped_total=7, pid=100))
    ing.handle(good(dropped_total=9, pid=100))
    ing.handle(good(dropped_total=3, pid=200))  # the rank restarted as a new process
    assert table.snapshot()[0].dropped_total == 12


def test_a_wait_in_progress_grows_the_sums_and_the_batch_settles_them():
    table = state.RankTable()
    ing = ingest_of(table)
    base = 0  # two minutes ago (t0)
    t0 = time.monotonic_ns() - 120 * 10**9
    # blocked in next() since base; reports at +1 s and +3 s, the batch arrives at +4 s
    assert ing.handle(good(t0, events=[], mono_ns=base + 10**9, blocked_since_ns=base))
    rank = table.snapshot()[0]
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (10**9, 10**9, 0)
    assert ing.handle(good(t0, events=[], mono_ns=base + 3 * 10**9, blocked_since_ns=base))
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (3 * 10**9, 3 * 10**9, 0)
    # the open wait is the timeline's last row, so the correlator analyses the hang itself
    # (no batch yet: the row is the wait so far, to the last report, all of it waiting
    # for a batch to be made)
    three = 3 * 10**9
    got = table.timeline(rank, 600, open_wait=True).rows(ready=True).tolist()
    assert got == [[t0 + three, three, three, three]]
    assert len(table.timeline(rank, 600)) == 0  # the API's batches: completed ones
    assert ing.handle(good(t0, events=[[base + 4 * 10**9, 4 * 10**9, 5 * 10**9]],
                           mono_ns=base + 4 * 10**9 + 5))
    # exactly the real wait and interval once it is over, counted once
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (4 * 10**9, 5 * 10**9, 1)
    assert rank.provisional_ns == 0
    done = [[t0 + 4 * 10**9, 4 * 10**9, 5 * 10**9]]
    assert table.timeline(rank, 600, open_wait=True).rows().tolist() == done
    # a call that ends without a batch (the epoch's last next(), StopIteration) keeps the
    # wait counted so far, and the next call's batch is not charged for it
    assert ing.handle(good(t0, events=[], mono_ns=base + 7 * 10**9, blocked_since_ns=base + 5 * 10**9))
    assert (rank.wait.sum_ns, rank.step.sum_ns) == (6 * 10**9, 7 * 10**9)
    assert ing.handle(good(t0, events=[[base + 9 * 10**9, 10**9, 10**9]], mono_ns=base + 9 * 10**9 + 5))
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (7 * 10**9, 8 * 10**9, 2)
    with pytest.raises(validate.Reject):
        validate.parse(good(mono_ns=5, blocked_since_ns=6))
