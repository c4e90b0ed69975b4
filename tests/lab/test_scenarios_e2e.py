"""Every scenario end to end, as `stallscope lab run SCENARIO --json`: a real 2-rank gloo
job with DataLoader workers, the real fault, the agent, Prometheus evaluating the
generated rules (short windows). The expected alerts fire (none for healthy and
compute-bound), the diagnosis names the injected cause first and the right rank, and
nothing the run created is left behind. Scenarios run in sequence, 20 s each."""
import json

import pytest

from stallscope.lab import scenarios
from tests.conftest import need_prometheus
from tests.lab.helpers import leftovers, run_lab

pytestmark = pytest.mark.slow
DURATION = 20


@pytest.mark.parametrize("name", [s.name for s in scenarios.SCENARIOS])
def test_scenario_is_caught_and_named(name, tmp_path):
    need_prometheus()
    pytest.importorskip("torch")
    s = scenarios.get(name)
    reason = s.make_fault().missing()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path / "run"
    traces = tmp_path / "traces"
    r = run_lab("run", name, "--duration", DURATION, "--json", "--workdir", workdir, "--prometheus",
                "--record", traces)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert leftovers(str(workdir)) == []

    ratios = {row["rank"]: row["data_wait_ratio"] for row in result["ranks"]}
    assert all(row["batches"] > 10 for row in result["ranks"]), result["ranks"]
    if s.stalls:
        # The injected rank waits on its loader; the other only waits in the all_reduce.
        assert ratios[1] > 0.05 and ratios[0] < 0.02, ratios
    else:
        assert max(ratios.values()) < 0.02, ratios
    assert result["found"]["rank"] == result["expected"]["rank"], result["found"]
    cause = result["found"]["cause"]
    if result["found"]["correlator"] or cause not in (None, "unexplained"):
        assert cause == s.cause, result["report"]
    # else: a build without the correlator may leave the cause open, never a wrong one
    alerts = result["alerts"]
    assert alerts["matched"] is True, alerts
    assert set(s.alerts) <= set(alerts["fired"])

    # --record: a trace the correlator's evaluation set can take as it is
    from stallscope.correlate import evaluate
    [(path, doc)] = evaluate.load(str(traces))
    assert path == result["recorded"]
    assert doc["labels"]["scenario"] == "lab-" + name and doc["labels"]["expected_cause"] == s.cause
    assert doc["timeline"]["rank"]["rank"] == 1 and [p["rank"]["rank"] for p in doc["peers"]] == [0]
    assert len(doc["timeline"]["batches"]) >= result["ranks"][1]["batches"]
    offline = evaluate.row(path, doc)
    assert offline["verdict"] == s.verdict, offline


def test_the_demo_scenario_needs_nothing_special(tmp_path, monkeypatch):
    """What `stallscope demo` runs on a laptop: no root (no pod namespaces or cgroups),
    no FUSE, no cgroup, no Prometheus; still the right rank and cause."""
    pytest.importorskip("torch")
    from stallscope.lab import pods, runner

    s = scenarios.get(scenarios.DEMO)
    assert s.make_fault().needs == () and s.stalls
    monkeypatch.setattr(pods, "isolated", lambda: False)  # as a user without root
    lines = []
    result = runner.run(s, runner.Options(duration=12, prometheus=False, workdir=str(tmp_path / "run"),
                                          say=lines.append, live=False))
    assert leftovers(str(tmp_path / "run")) == []
    from tests.lab.helpers import manifest
    assert manifest(str(tmp_path / "run"))["cgroups"] == []
    assert result["found"]["rank"] == 1 and result["found"]["cause"] == s.cause, result["report"]
    assert result["alerts"] is None and result["ok"]
    assert any(line.startswith("[####################]") for line in lines), lines  # progress shown
    assert "INPUT-BOUND" in result["report"] and "trainer-1" in result["report"]
