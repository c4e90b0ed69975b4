"""`report --job` and `top` read one computation of the hours lost (issue 52, item 3):
on the same job and period they print the same figures, and no worst period of
`report` loses more than the whole job. A real Prometheus (promtool-backfilled) holds a
2-rank job's 20 minutes: the hook's counters, and the records as the mixin's rules
define them (a 5-minute rate, so the idle-accelerator record trails a stall by minutes);
rank 1 waits half of each step for 5 of them, 1 % otherwise."""
import json
import subprocess
import sys
import time

import pytest

from stallscope.diagnose.prom import Prometheus
from stallscope.fleet import jobreport, top
from stallscope.mixin import promql
from stallscope.mixin.config import DEFAULT as CFG
from stallscope.processes.children import child_env
from tests.helpers import backfill
from tests.helpers.needs import need_prometheus

SCRAPE = 15.0
LENGTH = 1200.0
STALL = (300.0, 600.0)   # seconds into the job
RATE = 300.0             # the records' window (5m)


def _key(name, **labels):
    return tuple(sorted(dict(labels, __name__=name).items()))


def _history(t0):
    n = promql.names(CFG)
    out = {}
    ticks = [t0 + i * SCRAPE for i in range(int(LENGTH / SCRAPE) + 1)]
    counters = {}
    for rank in (0, 1):
        ids = dict(job="lj", namespace="ml", rank=str(rank), pod="lj-%d" % rank, node="n1")
        wait, step, waits, steps = 0.0, 0.0, [], []
        for t in ticks:
            if t > t0:
                share = 0.5 if rank == 1 and STALL[0] < t - t0 <= STALL[1] else 0.01
                wait += share * SCRAPE
                step += SCRAPE
            waits.append((t, wait))
            steps.append((t, step))
        out[_key("stallscope_data_wait_seconds_sum", **ids)] = waits
        out[_key("stallscope_step_seconds_sum", **ids)] = steps
        counters[rank] = (waits, steps)
        # the rank record: the share over the last 5 minutes (from the job's start while younger)
        rec = []
        for i, t in enumerate(ticks[1:], 1):
            j = max(0, i - int(RATE / SCRAPE))
            dw, ds = waits[i][1] - waits[j][1], steps[i][1] - steps[j][1]
            rec.append((t, dw / ds))
        out[_key(n["rank_ratio"], **ids)] = rec
    worst = [(t, max(dict(out[_key(n["rank_ratio"], job="lj", namespace="ml", rank=str(r), pod="lj-%d" % r,
                                   node="n1")])[t] for r in (0, 1))) for t in ticks[1:]]
    out[_key(n["job_idle"], job="lj", namespace="ml")] = [(t, 2 * v) for t, v in worst]
    out[_key(n["job_idle_cause"], job="lj", namespace="ml", cause="too_few_workers")] = [
        (t, 2 * v) for t, v in worst if v > CFG.data_wait_warning]
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    need_prometheus()
    end = time.time() - 120
    t0 = end - LENGTH
    prom = backfill.serve(_history(t0), str(tmp_path_factory.mktemp("lost") / "prom"))
    try:
        yield prom, t0, end
    finally:
        prom.stop()


def test_report_and_top_give_the_same_hours_and_no_period_exceeds_the_job(history):
    prom, t0, end = history
    # the period ends with the job: backfilled series have no staleness marker, so a
    # query later would see their last samples for 5 more minutes (Prometheus's lookback)
    now = end
    since = 1800.0
    rows = top.top(Prometheus(prom.url, now=now), CFG, since)
    doc = jobreport.report(Prometheus(prom.url, now=now), CFG, "lj", now - since, now)
    [row] = rows
    # what was injected: 2 ranks x (5 min at rank 1's 50 % + 15 min at 1 %)
    expected = 2 * ((STALL[1] - STALL[0]) * 0.5 + (LENGTH - (STALL[1] - STALL[0])) * 0.01) / 3600
    assert doc.lost_accelerator_hours == pytest.approx(expected, rel=0.06), (
        doc.lost_accelerator_hours, expected)
    assert doc.accelerator_hours == pytest.approx(2 * LENGTH / 3600, rel=0.05)
    assert (row.lost_accelerator_hours, row.accelerator_hours) == (doc.lost_accelerator_hours,
                                                                    doc.accelerator_hours)
    assert row.lost_share == doc.lost_share and row.cost == doc.cost
    assert row.cause_hours == doc.lost_by_cause and row.top_cause == "too_few_workers"
    assert sum(doc.lost_by_cause.values()) <= doc.lost_accelerator_hours * 1.001
    assert doc.worst_periods
    for p in doc.worst_periods:
        assert p.lost_accelerator_hours <= doc.lost_accelerator_hours, (p, doc.lost_accelerator_hours)
    assert row.worst_pod == "lj-1" and doc.recurring_stragglers[0].pod == "lj-1"


def test_the_two_commands_print_the_same_figures(history):
    prom, _, _ = history
    to = "%.0f" % time.time()  # the same period: two commands a moment apart end at the same time

    def cli(*args):
        out = subprocess.run([sys.executable, "-m", "stallscope", *args, "--prometheus", prom.url,
                              "--since", "30m", "--to", to, "--json"], env=child_env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    [t] = cli("top")["jobs"]
    r = cli("report", "--job", "lj")
    assert (t["lost_accelerator_hours"], t["accelerator_hours"], t["lost_share"]) == (
        r["lost_accelerator_hours"], r["accelerator_hours"], r["lost_share"])


def test_an_error_line_carries_no_encoded_query(history):
    prom, _, _ = history
    out = subprocess.run([sys.executable, "-m", "stallscope", "report", "--job", "lj", "--prometheus",
                          prom.url + "/nothing-here", "--since", "30m"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "%28" not in out.stderr and "query=" not in out.stderr, out.stderr
    assert len(out.stderr.strip()) < 160, out.stderr
