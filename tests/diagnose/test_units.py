"""Fast checks of diagnose's pure parts: durations, the stack classifier on py-spy's
JSON shape, the verdict rules, stuck detection, next steps and rendering."""
import os
import sys

import pytest

from stallscope.diagnose import classify, nextsteps, render, stacks, verdict, window
from stallscope.diagnose.document import EvidenceRow, NextStep, Sizing
from stallscope.report import LoaderSettings
from tests.helpers.diagnose import (
    cause,
    cluster,
    diagnosis,
    info,
    pod_signal,
    progress,
    replace,
    report,
    row,
    subject,
)


def test_durations():
    assert window.parse("15m") == 900 and window.parse("1h30m") == 5400
    assert window.parse("90") == 90 and window.parse("2.5s") == 2.5
    for bad in ("", "m", "15 m", "1y", "0s", "40d", "-5"):
        with pytest.raises(ValueError):
            window.parse(bad)
    assert window.promql(7.6) == "8s"
    assert window.human(5400) == "90m" and window.human(9000) == "2h30m" and window.human(75) == "75s"


def F(name, filename, line=1):
    return {"name": name, "filename": filename, "short_filename": filename.rsplit("/", 1)[-1],
            "line": line}


SITE = "/usr/lib/python3.11/site-packages/"
STD = "/usr/lib/python3.11/"
WORKER_LOOP = F("_worker_loop", SITE + "torch/utils/data/_utils/worker.py")
FETCHER = F("_MapDatasetFetcher.fetch", SITE + "torch/utils/data/_utils/fetch.py")
NEXT = F("_BaseDataLoaderIter.__next__", SITE + "torch/utils/data/dataloader.py")


def thread(*frames, active=True):
    return {"frames": list(frames), "active": active}


@pytest.mark.parametrize("frames,role,expected", [
    # a library's own module decides, innermost first
    ((F("ImageFile.load", SITE + "PIL/ImageFile.py"), F("Dataset.__getitem__", "/app/ds.py"),
      FETCHER, WORKER_LOOP), "worker", "decode"),
    # requests blocks in selectors (a wait) under urllib3: the fetch behind it wins
    ((F("select", STD + "selectors.py"), F("HTTPConnectionPool.urlopen", SITE + "urllib3/connectionpool.py"),
      F("Dataset.__getitem__", "/app/ds.py"), FETCHER, WORKER_LOOP), "worker", "fetch"),
    # the user's words: torch's own "fetch" is not I/O, the user's download_shard is
    ((F("download_shard", "/app/ds.py"), F("Dataset.__getitem__", "/app/ds.py"), FETCHER, WORKER_LOOP),
     "worker", "fetch"),
    ((F("myCollate", "/app/train.py"), FETCHER, WORKER_LOOP), "worker", "collate"),
    ((F("default_collate", SITE + "torch/utils/data/_utils/collate.py"), FETCHER, WORKER_LOOP),
     "worker", "collate"),
    # waiting straight under _worker_loop: no work
    ((F("Queue.get", STD + "multiprocessing/queues.py"), WORKER_LOOP), "worker", "idle"),
    # waiting inside the dataset (a thread pool): IPC wait
    ((F("Condition.wait", STD + "threading.py"), F("Future.result", STD + "concurrent/futures/_base.py"),
      F("Dataset.__getitem__", "/app/ds.py"), FETCHER, WORKER_LOOP), "worker", "ipc_wait"),
    # unnamed dataset work
    ((F("Dataset.__getitem__", "/app/ds.py"), FETCHER, WORKER_LOOP), "worker", "other"),
    # the main process waiting for a batch
    ((F("select", STD + "selectors.py"), F("Queue.get", STD + "multiprocessing/queues.py"),
      F("_try_get_data", SITE + "torch/utils/data/dataloader.py"), NEXT, F("train", "/app/train.py")),
     "main", "ipc_wait"),
    # the loop's own step beyond the boundary is not loader work
    ((F("read_batch_stats", "/app/train.py"),), "main", "outside_loader"),
])
def test_classification(frames, role, expected):
    assert classify.classify(thread(*frames), role)[0] == expected


def test_the_innermost_line_names_the_c_call(tmp_path):
    src = tmp_path / "ds.py"
    src.write_text("def get(self, i):\n    with open(self.p, 'rb') as f:\n        return f.read(1 << 20)\n")
    t = thread(F("Dataset.__getitem__", str(src), 3), FETCHER, WORKER_LOOP, active=False)
    cls, frame, line = classify.classify(t, "worker")
    assert (cls, line) == ("fetch", "return f.read(1 << 20)")


def test_py_spy_lookup(monkeypatch, tmp_path):
    monkeypatch.setenv("STALLSCOPE_PY_SPY", str(tmp_path / "none"))
    with pytest.raises(stacks.StacksError, match="py-spy not found at STALLSCOPE_PY_SPY="):
        stacks.find_py_spy()
    monkeypatch.delenv("STALLSCOPE_PY_SPY")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(stacks.StacksError, match=r"pip install 'stallscope\[stacks\]'"):
        stacks.find_py_spy()
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert stacks.find_py_spy() == str(exe)


def test_a_pid_is_local_only_when_the_trainer_sees_itself_as_it():
    me = os.getpid()
    assert stacks.is_local(me, me) and not stacks.is_local(me, me + 1)
    assert not stacks.is_local(2 ** 22 + 7)


def test_verdict_rules():
    slow, fast = row(1, "p1", "b", 0.2), row(0, "p0", "a", 0.005)
    cl = cluster(straggler=slow)
    me = subject(fast)
    assert verdict.decide(me, cl, None)[0] == "not_input_bound"
    # the agent's "healthy" covers its own loader only: the cluster names the straggler
    assert verdict.decide(me, cl, diagnosis("healthy", "ok"))[0] == "not_input_bound"
    assert verdict.decide(subject(slow), cl, None)[0] == "input_bound"
    # one truth (issue 16): the agent's healthy (its GPU stayed busy) does not outvote the
    # data-wait the page fired on; the busy GPU is said in the reason
    busy = diagnosis("healthy", "hid", gpu=(0.01, 0.0))
    v, why = verdict.decide(subject(slow), cl, busy)
    assert v == "input_bound" and "stayed busy" in why
    alone = cluster(straggler=fast)
    assert verdict.decide(me, alone, None)[0] == "healthy"
    assert verdict.decide(subject(replace(fast, data_wait_ratio=None)), alone, None)[0] == "unknown"


def test_stuck_needs_stacks_to_be_placed():
    prog = progress(50, 45.0, 0.2)
    me = subject(row(0, "p", "n", 0.0), job_scope="node", progress=prog)
    assert verdict.decide(me, None, None)[0] == "unknown"
    assert verdict.decide(me, None, None, {"main": "ipc_wait", "reading": "r"})[0] == "input_bound"
    outside = {"main": "outside_loader", "processes": [{"where": "x"}]}
    assert verdict.decide(me, None, None, outside)[0] == "not_input_bound"
    # a slow cadence is not a stall: 45 s is under 20 steps of 5 s
    me = replace(me, progress=replace(prog, median_interval_seconds=5.0))
    assert verdict.decide(me, None, None)[0] == "healthy"


def test_next_steps_follow_the_causes():
    d = report(causes=(cause("too_few_workers", 0.8), cause("unexplained", 0.2)),
               sizing=Sizing(num_workers=2, workers_needed=5, quota_limited=False))
    s = nextsteps.steps(d)
    assert (s[0].step, s[0].runbook) == ("Raise num_workers from 2 to 5; set persistent_workers=True.",
                                         "runbooks/StallscopeDataWaitHigh.md")
    # already persistent, and capped by the CPU quota: the fix is CPU, not only workers
    d = report(causes=(cause("too_few_workers", 0.8),),
               loader=LoaderSettings(num_workers=2, persistent_workers=True),
               sizing=Sizing(num_workers=2, workers_needed=3, workers_to_keep_up=6, quota_limited=True))
    assert nextsteps.steps(d)[0].step == (
        "Raise num_workers from 2 to 3; that is all the pod's CPU quota allows: raise its CPU "
        "limit (keeping up needs 6 workers).")
    d = report(causes=(cause("fuse_unhealthy", 0.9, "fuse_probe_seconds"),))
    assert nextsteps.steps(d)[0].runbook == "runbooks/StallscopeFuseMountStuck.md"
    assert nextsteps.steps(report(verdict="healthy"))[0].runbook is None


def test_render_text_has_the_verdict_line_and_the_table():
    d = report(evidence=(EvidenceRow("data_wait_ratio", 0.25, 0.02, "above", "over", "prometheus", rank=3),),
               causes=(cause("cpu_throttle", 0.91, summary="CFS throttled."),),
               next_steps=(NextStep("Raise the limit.", "runbooks/StallscopeCPUThrottled.md"),),
               commands=("stallscope diagnose p -n ml --stacks",), warnings=("w",))
    text = render.render_text(d)
    lines = text.splitlines()
    assert lines[0] == "INPUT-BOUND — pod p (ns ml): job j, rank 3, node n"
    assert "note: w" in lines
    found = [line for line in lines if line.strip().startswith("data_wait_ratio (rank 3)")][0].split()
    assert found[3:] == ["25.0%", ">2.0%", "OVER", "prometheus"]
    assert "  1. cpu_throttle          0.91  CFS throttled." in lines
    assert "  - Raise the limit.  [runbooks/StallscopeCPUThrottled.md]" in lines


def test_the_hooks_blocked_report_places_a_stuck_loop():
    me = subject(row(0, "p", "n", 0.0), job_scope="node", progress=progress(0, None, None),
                 rank_info=info(blocked_in_next_seconds=42.0, last_seen_seconds_ago=0.5))
    v, why = verdict.decide(me, None, None)
    assert v == "input_bound" and why.startswith("Rank 0 has been blocked in next() for 42s")
    # batches stopped, the hook reports, the loop is not in next(): stuck elsewhere
    me = replace(me, rank_info=info(blocked_in_next_seconds=0.0, last_seen_seconds_ago=2.0))
    assert verdict.decide(me, None, None)[0] == "not_input_bound"
    # ... unless the hook went quiet too
    me = replace(me, rank_info=info(blocked_in_next_seconds=0.0, last_seen_seconds_ago=60.0))
    assert verdict.decide(me, None, None)[0] == "unknown"
    # in next() only briefly (a new epoch's first batch): not placed
    me = replace(me, rank_info=info(blocked_in_next_seconds=1.0, last_seen_seconds_ago=0.2))
    assert verdict.decide(me, None, None)[0] == "unknown"
    # Prometheus alone: no batch, the whole window waited
    r = row(0, "p", "n", 0.98)
    me = subject(r, batches=0.0)
    assert verdict.decide(me, cluster(straggler=r), None)[0] == "input_bound"
    assert verdict.decide(replace(me, data_wait_ratio=None), cluster(), None)[0] == "unknown"


def test_without_the_agent_a_measured_transfer_share_is_scored_at_its_value():
    """Prometheus alone: transfer_wait_ratio is the share of the wait the hook measured as
    transfer, the correlator's own score for transfer_cost, not a level-only candidate."""
    from stallscope.diagnose import cluster as cluster_mod

    assert "transfer_wait_ratio" in [s[0] for s in cluster_mod.POD_SIGNALS]
    moved = pod_signal("transfer_wait_ratio", "transfer_cost", 0.83, 0.5)
    got = verdict.causes_without_agent(cluster(signals=[moved]))
    assert [(c.cause, c.score) for c in got] == [("transfer_cost", 0.83), ("unexplained", 0.17)]
    assert "83.0%" in got[0].summary
    # a minority of the wait: not named
    got = verdict.causes_without_agent(cluster(signals=[replace(moved, value=0.3)]))
    assert [c.cause for c in got] == ["unexplained"]
    # level-only evidence for the others stays a candidate at 0.5
    psi = pod_signal("psi_io_some_ratio", "io_pressure", 0.4, 0.2)
    got = verdict.causes_without_agent(cluster(signals=[moved, psi]))
    assert [(c.cause, c.score) for c in got][:2] == [("transfer_cost", 0.83), ("io_pressure", 0.5)]
    s = nextsteps.steps(report(causes=tuple(got)))
    assert "fewer tensors per sample" in s[0].step
    assert s[0].runbook == "runbooks/StallscopeDataWaitHigh.md"
    # workers short of CPU stretch the handover: the transfer counts for what is left
    cfs = pod_signal("cfs_throttled_ratio", "cpu_throttle", 0.6, 0.25)
    got = {c.cause: c.score for c in verdict.causes_without_agent(cluster(signals=[moved, cfs]))}
    assert got == {"cpu_throttle": 0.5, "transfer_cost": 0.415, "unexplained": 0.5}
    got = verdict.causes_without_agent(cluster(signals=[moved], cause_scores=[("cpu_throttle", 0.8)]))
    assert {c.cause: c.score for c in got} == {"cpu_throttle": 0.8, "transfer_cost": 0.166,
                                               "unexplained": 0.2}
    # the correlator published its own remainder: it is the one listed, once
    got = verdict.causes_without_agent(cluster(cause_scores=[("slow_worker", 0.3), ("unexplained", 0.6)]))
    assert [(c.cause, c.score) for c in got] == [("unexplained", 0.6), ("slow_worker", 0.3)]
