"""Every scenario with a real run end to end, as `stallscope lab run SCENARIO --json`: a
real 2-rank gloo job with DataLoader workers, the real fault, the agent, Prometheus
evaluating the generated rules (short windows). The expected alerts fire (none for
healthy and compute-bound), the diagnosis names the injected cause first and the right
rank, the recorded trace is diagnosed offline as labelled, and nothing the run created
is left behind. Scenarios run in sequence, 20 s each."""
import json

import pytest

from stallscope import vocabulary
from stallscope.lab import evaluate, scenarios, traces
from tests.helpers.lab import leftovers, run_lab
from tests.helpers.needs import need_prometheus

pytestmark = pytest.mark.slow
DURATION = 20


def node_wide(cause):
    """A cause the vocabulary reads from node signals only (checkpoint bursts): its fault
    loads the whole node (upload streams, writes through to the disk), so the healthy
    rank's loader may slip past the line too, if far less than the injected rank's."""
    lines = vocabulary.cause(cause).lines
    return bool(lines) and all(line.scopes == ("node",) for line in lines)


@pytest.mark.parametrize("name", [s.name for s in scenarios.REAL])
def test_scenario_is_caught_and_named(name, tmp_path):
    need_prometheus()
    pytest.importorskip("torch")
    s = scenarios.get(name)
    reason = s.make_fault().missing()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path / "run"
    recorded = tmp_path / "traces"
    r = run_lab("run", name, "--duration", DURATION, "--json", "--workdir", workdir, "--prometheus",
                "--record", recorded)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert leftovers(str(workdir)) == []

    ratios = {row["rank"]: row["data_wait_ratio"] for row in result["ranks"]}
    assert all(row["batches"] > 10 for row in result["ranks"]), result["ranks"]
    if s.stalls:
        # The injected rank waits on its loader; the other only waits in the all_reduce.
        assert ratios[1] > 0.05, ratios
        if node_wide(s.cause):
            assert ratios[0] < ratios[1] / vocabulary.STRAGGLER_FACTOR, ratios
        else:
            assert ratios[0] < vocabulary.DATA_WAIT_LINE, ratios
    else:
        assert max(ratios.values()) < vocabulary.DATA_WAIT_LINE, ratios
    assert result["found"]["rank"] == result["expected"]["rank"], result["found"]
    assert result["found"]["cause"] == s.cause, result["report"]
    alerts = result["alerts"]
    assert alerts["matched"] is True, alerts
    assert set(s.real.alerts) <= set(alerts["fired"])

    # --record: a trace the correlator's evaluation set can take as it is, of the rank
    # the scenario's view names (the faulty one, or the peer waiting for it)
    [(path, doc)] = traces.load(str(recorded))
    assert path == result["recorded"] == str(recorded / ("lab-%s.json" % name))
    verdict, cause = s.trace_labels()
    assert doc["labels"]["scenario"] == "lab-" + name
    assert (doc["labels"]["expected_verdict"], doc["labels"]["expected_cause"]) == (verdict, cause)
    shown = 0 if s.view == "peer" else 1
    assert doc["timeline"]["rank"]["rank"] == shown
    assert [p["rank"]["rank"] for p in doc["peers"]] == [1 - shown]
    assert len(doc["timeline"]["batches"]) >= result["ranks"][shown]["batches"]
    offline = evaluate.row(path, doc)
    assert offline["verdict"] == verdict, offline


def test_the_demo_scenario_needs_nothing_special(tmp_path, monkeypatch):
    """What `stallscope demo` runs on a laptop: no root (no pod namespaces or cgroups),
    no FUSE, no cgroup, no Prometheus; still the right rank and cause."""
    pytest.importorskip("torch")
    from stallscope.lab import pods, runner

    s = scenarios.get(scenarios.DEMO)
    assert s.make_fault().missing() is None and s.make_fault().needs == () and s.stalls
    monkeypatch.setattr(pods, "isolated", lambda: False)  # as a user without root
    lines = []
    result = runner.run(s, runner.Options(duration=12, prometheus=False, workdir=str(tmp_path / "run"),
                                          say=lines.append, live=False))
    assert leftovers(str(tmp_path / "run")) == []
    from tests.helpers.lab import manifest
    assert manifest(str(tmp_path / "run"))["cgroups"] == []
    assert result["found"]["rank"] == 1 and result["found"]["cause"] == s.cause, result["report"]
    assert result["alerts"] is None and result["ok"]
    assert any(line.startswith("[####################]") for line in lines), lines  # progress shown
    assert "INPUT-BOUND" in result["report"] and "trainer-1" in result["report"]
