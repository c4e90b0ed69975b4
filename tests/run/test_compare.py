"""`stallscope compare` on the steady state (issue 52, item 2): a run that followed the
advice (more workers) pays a longer start, its first batch while the workers fork; that
batch is reported beside the comparison, not counted in it, unless --whole-run. The
run's start-up is recovered from the correlator's own window (session.startup) exactly
as injected."""
import dataclasses
import json
import subprocess
import sys

import pytest

from stallscope.correlate import codec, diagnosis
from stallscope.processes.children import child_env
from stallscope.run import compare, session
from stallscope.run.outcome import SavedRun
from tests.helpers.correlate import events_from_waits
from tests.helpers.correlate import trace_of as _trace_of

COMPUTE = 0.15


def _body(first_wait, steady_wait, n=60):
    """The agent's diagnosis of a run whose first batch waited ``first_wait`` (its workers'
    start) and every later one ``steady_wait``, each followed by COMPUTE of work."""
    import dataclasses
    events = events_from_waits([first_wait] + [steady_wait] * (n - 1), compute_s=COMPUTE)
    trace = dataclasses.replace(_trace_of(events, workers=8), first_batch_ns=events[0][0])
    return codec.encode(diagnosis.analyse(trace))


def _report(path, body, verdict="healthy"):
    """A run report as session.finish writes it, for the worst (and only) rank."""
    row = {"job": "j", "rank": 0, "batches": body["batches"], "data_wait_ratio": body["data_wait_ratio"],
           "step_seconds_mean": body["step_seconds"] / body["batches"],
           "data_wait_ratio_after_start": body.get("data_wait_ratio_after_start")}
    row.update(session.startup(codec.decode(body)))
    doc = {"job": "j", "rank": 0, "verdict": verdict, "reason": "r", "causes": [],
           "data_wait_ratio": body["data_wait_ratio"],
           "run": {"exit_status": 0, "outcome": "ok", "ranks": [row]}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_start_up_is_recovered_from_the_window_as_injected():
    body = _body(3.0, 0.002)
    got = session.startup(codec.decode(body))
    # the first batch's interval is its wait (3 s); the others 2 ms + 150 ms of compute
    assert got["startup_seconds"] == pytest.approx(3.0, abs=0.002), (got, body)
    assert got["step_seconds_mean_after_start"] == pytest.approx(COMPUTE + 0.002, rel=0.01), got
    d = codec.decode(body)  # a window whose share without the first batch is not known
    assert session.startup(dataclasses.replace(
        d, loop=dataclasses.replace(d.loop, data_wait_ratio_after_start=None))) == {}


def _compare(a, b, *extra):
    return subprocess.run([sys.executable, "-m", "stallscope", "compare", a, b, *extra],
                          env=child_env(), text=True, capture_output=True, timeout=60)


def test_a_longer_start_up_is_not_a_regression_unless_the_whole_run_is_asked_for(tmp_path):
    # the same steady pace (10 ms waits); B's 8 workers took 4 s to start against A's 0.3 s
    a = _report(tmp_path / "a.json", _body(0.3, 0.010))
    b = _report(tmp_path / "b.json", _body(4.0, 0.010))
    r = _compare(a, b)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "start-up" in r.stdout and "4.000s" in r.stdout and "0.300s" in r.stdout, r.stdout
    assert "Compared: the steady state" in r.stdout, r.stdout
    whole = _compare(a, b, "--whole-run")
    assert whole.returncode == 1 and "REGRESSED" in whole.stdout, whole.stdout
    doc = json.loads(_compare(a, b, "--json").stdout)
    assert doc["compared"] == "steady_state" and abs(doc["data_wait"]["delta_points"]) < 0.002, doc
    assert doc["b"]["whole_run_data_wait_ratio"] > 0.02, doc["b"]
    # a steady state that got worse is still caught: 10 ms -> 30 ms of wait a batch
    worse = _report(tmp_path / "w.json", _body(0.3, 0.030))
    assert _compare(a, worse).returncode == 1


def test_a_report_without_the_split_is_compared_whole():
    doc = SavedRun.from_json({"data_wait_ratio": 0.2, "rank": 0, "job": "j",
                              "run": {"ranks": [{"rank": 0, "job": "j", "step_seconds_mean": 0.5}]}})
    assert compare.data_wait(doc, whole_run=False) == 0.2
    assert compare.step_seconds(doc, whole_run=False) == 0.5
    assert compare.startup_seconds(doc) is None
