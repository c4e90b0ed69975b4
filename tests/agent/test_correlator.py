"""The correlator part inside an (unstarted) agent: metrics, the diagnosis route, the
timeline it reads."""
import dataclasses
import time

import pytest
from prometheus_client import generate_latest

from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.agent.parts import correlator as correlator_mod
from stallscope.correlate.model import BUDGET_WORDS
from stallscope.host import ApiError
from stallscope.host.report import BatchColumns
from stallscope.lab import synth
from stallscope.vocabulary import DATA_WAIT_LINE
from tests.helpers.correlate import report, simulated


@pytest.fixture
def agent(tmp_path):
    a = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook.sock"), node="node-a")))
    t0 = time.monotonic_ns() - 100 * synth.SEC  # within the timelines' horizon
    slow, _ = simulated(1, 2, load=0.5, compute=0.1, n=300, t0=t0)
    fast, _ = simulated(2, 4, load=0.1, compute=0.1, n=300, t0=t0)
    a.apply(report("train", 0, "pod-0", slow))
    a.apply(report("train", 1, "pod-0", fast, workers=4))  # two ranks in one pod
    a.apply(report("other", 0, "pod-9", fast, workers=4))
    now = time.monotonic_ns()
    for k in range(5):
        a.samples.record("node", "psi_io_some_ratio", 0.01, now - k * synth.SEC)
    return a


def route(agent, **q):
    return agent.correlator.route({k: [str(v)] for k, v in q.items()})


def test_diagnosis_by_pod_picks_the_worst_rank_and_lists_the_others(agent):
    status, body = route(agent, pod="pod-0")
    assert status == 200
    assert body["rank"] == 0 and body["verdict"] == "input_bound"
    assert body["causes"][0]["cause"] == "too_few_workers"
    assert {r["rank"]: r["verdict"] for r in body["matched_ranks"]} == {
        0: "input_bound", 1: "not_input_bound"}
    assert body["straggler"]["rank"] == 0
    for key in ("verdict", "causes", "data_wait_ratio", "gpu_idle_overlap_ratio",
                "stall_period_steps", "job", "rank", "pod", "namespace", "node", "straggler"):
        assert key in body


def test_diagnosis_by_rank_and_job(agent):
    _, body = route(agent, rank=1, job="train", seconds=100)
    assert body["rank"] == 1 and body["window_seconds"] == 100.0
    assert body["verdict"] == "not_input_bound"  # its peer rank 0 is the straggler
    assert body["straggler"]["rank"] == 0


@pytest.mark.parametrize("query, status, text", [
    ({}, 400, "give pod="),
    ({"rank": 0}, 400, "add job="),
    ({"rank": "zero"}, 400, "bad value"),
    ({"pod": "pod-0", "seconds": 0}, 400, "bad value"),
    ({"pod": "pod-0", "verbose": 1}, 400, "unknown parameters: verbose"),
    ({"pod": "nope"}, 404, "no live rank on node node-a"),
    ({"rank": 5, "job": "train"}, 404, "no live rank"),
])
def test_bad_requests_say_why(agent, query, status, text):
    with pytest.raises(ApiError) as e:
        route(agent, **query)
    assert e.value.status == status and text in e.value.message


def test_metrics_stay_within_the_per_rank_budget(agent):
    agent.correlator.refresh()
    text = generate_latest(agent.registry).decode()
    assert ('stallscope_stall_period_steps{job="train",namespace="ns",node="node-a",pod="pod-0",rank="0"} 2.0'
            in text)
    assert 'stallscope_stall_cause_score{cause="too_few_workers",job="train"' in text
    assert "stallscope_correlator_runs_total 1.0" in text
    per_rank, budget = {}, []
    for line in text.splitlines():
        if line.startswith("stallscope_stall_budget_ratio{"):
            budget.append(line)  # per pod, off the per-rank budget
        elif line.startswith(("stallscope_gpu_idle_overlap", "stallscope_stall_")):
            key = line[line.index("{"):].split("}")[0]
            key = ",".join(p for p in key.strip("{").split(",") if not p.startswith("cause="))
            per_rank[key] = per_rank.get(key, 0) + 1
    assert len(per_rank) == 3
    assert max(per_rank.values()) <= 2 + correlator_mod.MAX_CAUSE_SERIES
    # the input-bound rank's time budget, once for its pod: no rank label, a component a series
    assert budget and all('rank="' not in b and 'pod="pod-0"' in b for b in budget), budget
    assert len(budget) <= len(BUDGET_WORDS)
    assert sum(float(b.rsplit(" ", 1)[1]) for b in budget) <= 1.0 + 1e-9


def test_timeline_carries_loader_and_separate_node_signals(agent):
    status, body = agent.routes["/api/v1/timeline"]({"rank": ["0"], "job": ["train"], "seconds": ["300"]})
    assert status == 200
    assert body["loader"]["num_workers"] == 2
    assert "psi_io_some_ratio" in body["node_signals"] and body["signals"] == {}


def test_a_failing_run_is_counted(agent, monkeypatch):
    monkeypatch.setattr(correlator_mod.diagnosis, "analyse", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        agent.correlator.refresh()
    assert "stallscope_correlator_failures_total 1.0" in generate_latest(agent.registry).decode()


def test_schedule_runs_every_interval_and_sooner_while_a_rank_gathers_data(agent):
    c = agent.correlator
    c.tick(now=1000.0)
    assert c.runs == 1  # the first tick runs
    c.tick(now=1001.0)
    assert c.runs == 1  # all three ranks have a verdict: wait for the interval
    agent.apply(report("train", 7, "pod-7", []))  # a new rank, no batches yet
    c.tick(now=1001.5)
    assert c.runs == 1  # not before GATHERING_S
    c.tick(now=1000.0 + correlator_mod.GATHERING_S)
    assert c.runs == 2
    c.tick(now=1000.0 + 2 * correlator_mod.GATHERING_S)
    assert c.runs == 3  # rank 7 is still "unknown": keep looking
    c.tick(now=1000.0 + 2 * correlator_mod.GATHERING_S + c.every)
    assert c.runs == 4


def test_a_steady_stall_is_not_ranked_again_until_its_inputs_move(tmp_path):
    """The rank waits ~75 % of its step throughout: detected each tick, its causes ranked
    once; a later tick with nothing new reuses them (agent/parts/rerank.py); a new signal
    for the rank, or a minute, ranks them again."""
    from stallscope.agent.parts import rerank

    a = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook.sock"), node="node-a")))
    t0 = time.monotonic_ns() - 80 * synth.SEC  # an old stall: past its first minute
    slow, _ = simulated(1, 2, load=0.8, compute=0.1, n=200, t0=t0)  # ~0.4 s a step: 80 s
    a.apply(report("train", 0, "pod-0", slow))
    c = a.correlator
    c.detect(now=1000.0)
    assert c.detections[next(iter(c.detections))].stalled
    assert c.stall_runs == 1
    c.detect(now=1000.0 + c.every)  # due by its age, nothing moved
    assert c.stall_runs == 1
    a.samples.record(a.table.snapshot()[0].key, "cfs_throttled_ratio", 0.5)
    c.detect(now=1000.0 + 2 * c.every)  # a signal appeared for the rank
    assert c.stall_runs == 2
    c.detect(now=1000.0 + 2 * c.every + rerank.MAX_AGE_S)
    assert c.stall_runs == 3


def test_a_rank_over_the_line_only_by_its_first_batch_is_starting_until_a_new_process(tmp_path):
    # correlate/rules.py: starting. The agent keeps the process's first batch, the
    # timeline says which, and a restarted process (another PID) starts again.
    a = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook.sock"), node="node-a")))
    t0 = time.monotonic_ns() - 100 * synth.SEC
    events, _ = simulated(3, 4, load=0.15, compute=0.1, n=150, t0=t0,
                          extra=lambda k, t: 0.6 if k == 0 else 0.0)
    a.apply(report("train", 0, "pod-0", events[:100], workers=4))
    a.apply(report("train", 0, "pod-0", events[100:], workers=4))
    _, body = a.routes["/api/v1/timeline"]({"rank": ["0"], "job": ["train"], "seconds": ["300"]})
    assert body["first_batch_ns"] == events[0][0] and body["batches"][0]["t_end_ns"] == events[0][0]
    _, d = route(a, pod="pod-0")
    assert d["verdict"] == "unknown" and "starting" in d["reason"]
    assert d["data_wait_ratio"] >= DATA_WAIT_LINE > d["data_wait_ratio_after_start"]
    a.correlator.refresh()
    assert [v.verdict for _, v in a.correlator.current()] == ["unknown"]
    restarted = dataclasses.replace(report("train", 0, "pod-0", [], workers=4), pid=2000)
    a.apply(restarted)
    assert a.table.ranks[("ns", "pod-0", "train", 0)].first_batch_ns is None
    later = [(e + 200 * synth.SEC, w, i) for e, w, i in events[:30]]
    a.apply(dataclasses.replace(restarted, events=BatchColumns.of(later)))
    assert a.table.ranks[("ns", "pod-0", "train", 0)].first_batch_ns == later[0][0]


def test_the_correlator_hurries_for_batches_not_for_a_start_to_be_outweighed(tmp_path):
    # tick(): every GATHERING_S while a rank has too few batches for a verdict; a starting
    # rank has its ratio and is judged at the interval like any other verdict
    a = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook.sock"), node="node-a")))
    t0 = time.monotonic_ns() - 100 * synth.SEC
    events, _ = simulated(3, 4, load=0.15, compute=0.1, n=150, t0=t0,
                          extra=lambda k, t: 0.6 if k == 0 else 0.0)
    a.apply(report("train", 0, "pod-0", events, workers=4))
    c = a.correlator
    c.tick(1000.0)
    assert c.runs == 1 and [r.diagnosis.verdict for r in c.results.values()] == ["unknown"]
    c.tick(1000.0 + correlator_mod.GATHERING_S)
    assert c.runs == 1  # starting: not re-run before the interval
    a.apply(report("train", 1, "pod-1", events[:5], workers=4))  # too few batches yet
    c.tick(1000.0 + 2 * correlator_mod.GATHERING_S)
    assert c.runs == 2
    c.tick(1000.0 + c.every)
    assert c.runs == 3


def test_one_analysis_per_rank_and_window_for_each_diagnosis_answer(tmp_path):
    """Issue 29: a stalled rank asked for was analysed on the default window, then again on
    its stall's, the first answer thrown away. Now: one analysis per rank and window."""
    a = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook.sock"), node="node-a")))
    t0 = time.monotonic_ns() - 80 * synth.SEC
    slow, _ = simulated(1, 2, load=0.8, compute=0.1, n=200, t0=t0)   # stalls throughout
    fast, _ = simulated(2, 4, load=0.1, compute=0.1, n=300, t0=t0)
    a.apply(report("train", 0, "pod-0", slow))
    a.apply(report("other", 0, "pod-9", fast, workers=4))
    c = a.correlator
    c.detect(now=1000.0)
    stalled = {k for k, d in c.detections.items() if d.stalled}
    assert len(stalled) == 1  # the slow rank, dated by the detector
    for query, verdict in (({"pod": "pod-0"}, "input_bound"), ({"pod": "pod-9"}, "healthy")):
        before = c.analyses
        _, body = route(a, **query)
        assert body["verdict"] == verdict
        assert c.analyses - before == 1, query
    _, body = route(a, pod="pod-0")
    assert body["detection"]["stalled"] and body["since_ns"] == body["detection"]["since_ns"]
    # two ranks of one pod: one analysis each
    b = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook2.sock"), node="node-a")))
    b.apply(report("train", 0, "pod-0", slow))
    b.apply(report("train", 1, "pod-0", fast, workers=4))
    before = b.correlator.analyses
    _, body = route(b, pod="pod-0")
    assert len(body["matched_ranks"]) == 2 and b.correlator.analyses - before == 2


def test_a_rank_without_news_is_tested_again_only_after_rejudge(tmp_path, monkeypatch):
    """Issue 31: a steady trainer reports every 2 s, so half of the detector's tests of a
    second read the same input. A rank with no new batch and the same blocked call keeps
    its test for REJUDGE_NS; a new batch, or a call blocked in next(), is tested at once."""
    from stallscope.agent.parts import correlator as part
    from stallscope.correlate import detect

    a = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "hook.sock"), node="node-a")))
    t0 = time.monotonic_ns() - 80 * synth.SEC
    slow, _ = simulated(1, 2, load=0.8, compute=0.1, n=200, t0=t0)
    a.apply(report("train", 0, "pod-0", slow[:150]))
    tests = []
    real = detect.judge
    monkeypatch.setattr(part.detect, "judge", lambda *args: tests.append(1) or real(*args))
    clock = [time.monotonic_ns()]
    monkeypatch.setattr(part.time, "monotonic_ns", lambda: clock[0])
    c = a.correlator
    c.detect(now=1000.0)
    first = next(iter(c.detections.values()))
    assert first.stalled and len(tests) == 1
    clock[0] += part.REJUDGE_NS - 1
    c.detect(now=1001.0)
    assert len(tests) == 1 and next(iter(c.detections.values())) is first  # no news: kept
    a.apply(report("train", 0, "pod-0", slow[150:]))
    c.detect(now=1001.5)
    assert len(tests) == 2  # a new batch: tested at once
    clock[0] += part.REJUDGE_NS
    c.detect(now=1003.0)
    assert len(tests) == 3  # no news, but REJUDGE_NS passed: tested again
    assert next(iter(c.detections.values())).stalled
