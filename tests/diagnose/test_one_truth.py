"""The page and diagnose agree (issue 16): a real Prometheus scrapes per-rank data-wait
series whose ratios sit at the margin of the line (and a job with one straggler among
victims at the transfer floor); for every rank, when the headline alert's expression is
true over diagnose's window, diagnose's verdict through Prometheus is not ``healthy``,
and victims are ``not_input_bound`` naming the straggler."""
import json
import subprocess
import sys
import time

import pytest

from stallscope.mixin import promql
from stallscope.mixin.config import DEFAULT as CFG
from stallscope.processes.children import child_env
from stallscope.processes.servers import PrometheusProcess
from tests.helpers.gpu import DcgmServer as MetricsPage  # serves a /metrics page
from tests.helpers.needs import need_prometheus

pytestmark = pytest.mark.slow
WINDOW = "12s"
STEP = 0.1  # seconds per batch
# (job, rank, data-wait ratio): margin cases of the 2 % line, and issue 16's victims
RANKS = [("margin", 0, 0.026), ("margin", 1, 0.032),
         ("under", 0, 0.012), ("under", 1, 0.019),
         ("victims", 0, 0.022), ("victims", 1, 0.025), ("victims", 2, 0.023), ("victims", 3, 0.20)]


T0 = time.monotonic()


def render():
    """The hook's per-rank histograms as a real agent would serve them, the sums growing
    at exactly the configured ratio (so rate() over any window gives it back)."""
    t = 1000.0 + time.monotonic() - T0
    n = int(t / STEP)
    out = []
    for metric in ("stallscope_data_wait_seconds", "stallscope_step_seconds"):
        out.append("# TYPE %s histogram" % metric)
        for job, rank, ratio in RANKS:
            lab = 'job="%s",rank="%d",pod="%s-%d",namespace="ml",node="n%d"' % (
                job, rank, job, rank, rank % 2)
            total = t * (ratio if metric == "stallscope_data_wait_seconds" else 1.0)
            out.append('%s_bucket{%s,le="+Inf"} %d' % (metric, lab, n))
            out.append("%s_sum{%s} %.6f" % (metric, lab, total))
            out.append("%s_count{%s} %d" % (metric, lab, n))
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    need_prometheus()
    exp = MetricsPage(render)
    p = PrometheusProcess([exp.url], workdir=str(tmp_path_factory.mktemp("prom"))).start()
    try:
        sli = promql.data_wait_ratio(CFG, (), WINDOW)
        p.wait_for("count(%s)" % sli, lambda r: r and float(r[0]["value"][1]) == len(RANKS), timeout=60)
        time.sleep(13)  # a full window of samples
        yield p
    finally:
        p.stop()
        exp.close()


def diagnose(prom, pod):
    p = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", pod, "-n", "ml",
                        "--prometheus", prom.url, "--window", WINDOW, "--json"],
                       env=child_env(), capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stderr
    return p.returncode, json.loads(p.stdout)


def test_the_headline_alert_and_diagnose_agree_on_every_rank(prom):
    # The alert's expression (StallscopeDataWaitHigh: the job's max ratio over the line),
    # evaluated over diagnose's window rather than the 5m recording rule.
    expr = "max by (namespace, job) (%s) > %s" % (promql.data_wait_ratio(CFG, (), WINDOW),
                                                  promql.num(CFG.data_wait_warning))
    firing = {r["metric"]["job"] for r in prom.query(expr)}
    assert firing == {"margin", "victims"}  # the injected ratios, measured back
    verdicts = {}
    for job, rank, ratio in RANKS:
        rc, doc = diagnose(prom, "%s-%d" % (job, rank))
        verdicts[(job, rank)] = doc["verdict"]
        assert doc["data_wait_ratio"] == pytest.approx(ratio, abs=0.002)
        if job in firing:
            assert doc["verdict"] != "healthy" and rc == 1, doc["reason"]
        over = [row for row in doc["evidence"] if row["signal"] == "data_wait_ratio"][0]
        # the report never contradicts its own evidence row
        assert (over["status"] == "over") == (ratio >= CFG.data_wait_warning)
        assert not (over["status"] == "over" and doc["verdict"] == "healthy")
        assert over["source"] == "prometheus"
    assert verdicts == {
        ("margin", 0): "input_bound",  # rank 1's 3.2 % is within 3x of its 2.6 %: both over
        ("margin", 1): "input_bound",
        ("under", 0): "healthy", ("under", 1): "healthy",
        ("victims", 0): "not_input_bound", ("victims", 1): "not_input_bound",
        ("victims", 2): "not_input_bound", ("victims", 3): "input_bound"}


def test_a_victim_names_the_straggler(prom):
    rc, doc = diagnose(prom, "victims-1")
    assert doc["verdict"] == "not_input_bound" and rc == 1
    assert doc["straggler"]["rank"] == 3 and "victims-3" in doc["reason"]
