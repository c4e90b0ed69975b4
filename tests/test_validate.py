"""Every hook message is untrusted: malformed and hostile ones are rejected by reason and
the agent keeps running."""
import json
import random

import pytest

from stallscope.agent import ingest, state, validate
from stallscope.hook import wire


def good(**over):
    msg = {"v": 1, "kind": "report", "pid": 1234, "role": "main", "mono_ns": 10, "wall_ns": 20,
           "dropped_total": 0,
           "id": {"job": "j", "rank": 0, "local_rank": 0, "world_size": 2, "pod": "p",
                  "namespace": "ns", "node": "n"},
           "events": [[1_000_000, 100, 200], [2_000_000, 50, 1_000_000]],
           "loader": {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False,
                      "persistent_workers": False, "batch_size": 4, "worker_pids": [11, 12]}}
    msg.update(over)
    return json.dumps(msg).encode()


def test_good_message_parses():
    msg = validate.parse(good())
    assert msg["id"]["rank"] == 0 and len(msg["events"]) == 2
    assert msg["loader"]["worker_pids"] == [11, 12]


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
    (good(v=2), "bad_version"),
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
])
def test_rejects_with_reason(data, reason):
    with pytest.raises(validate.Reject) as e:
        validate.parse(data)
    assert e.value.reason == reason


def test_ingest_counts_rejects_and_enforces_the_rank_cap():
    table = state.RankTable(max_ranks=2)
    ing = ingest.Ingest(sock=None, apply=table.apply)
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
    ing = ingest.Ingest(sock=None, apply=table.apply)
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
    ing = ingest.Ingest(sock=None, apply=table.apply)
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
    ing = ingest.Ingest(sock=None, apply=table.apply)
    ing.handle(good(dropped_total=7), peer_pid=100)
    ing.handle(good(dropped_total=9), peer_pid=100)
    ing.handle(good(dropped_total=3), peer_pid=200)  # the rank restarted as a new process
    assert table.snapshot()[0].dropped_total == 12


def test_a_wait_in_progress_grows_the_sums_and_the_batch_settles_them():
    table = state.RankTable()
    ing = ingest.Ingest(sock=None, apply=table.apply)
    base = 10**12
    # blocked in next() since base; reports at +1 s and +3 s, the batch arrives at +4 s
    assert ing.handle(good(events=[], mono_ns=base + 10**9, blocked_since_ns=base))
    rank = table.snapshot()[0]
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (10**9, 10**9, 0)
    assert ing.handle(good(events=[], mono_ns=base + 3 * 10**9, blocked_since_ns=base))
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (3 * 10**9, 3 * 10**9, 0)
    assert ing.handle(good(events=[[base + 4 * 10**9, 4 * 10**9, 5 * 10**9]], mono_ns=base + 4 * 10**9 + 5))
    # exactly the real wait and interval once it is over, counted once
    assert (rank.wait.sum_ns, rank.step.sum_ns, rank.wait.count) == (4 * 10**9, 5 * 10**9, 1)
    assert rank.provisional_ns == 0
    with pytest.raises(validate.Reject):
        validate.parse(good(mono_ns=5, blocked_since_ns=6))
