"""Input goodput as an SLO, live (issue 53): a real Prometheus (Debian 2.42) evaluates the
rules generated from a config whose SLO windows are seconds (the same rules, the
Workbook's burn factors and the 98 % target, windows scaled down), scraping every
second a real agent fed by real hooks (`stallscope.watch` over a loader whose next()
sleeps a set share of each step), a kube-state-metrics page that says which pods run,
and a page of one job's hook counters growing at exact rates (the budget questions
need numbers known to the digit):

- ``severe``: two ranks, healthy for a whole fast-burn long window; then rank 0 waits
  90 % of each step: the fast-burn page fires, within the bound its windows give
  (measured and printed), and resolves within its short window of the stall ending;
- ``mild``: 5 % waiting, 2.5x the budget's pace: the ticket opens, never a page;
- ``healthy``: nothing waits: nothing fires;
- ``unwatched``: its trainer exits after 8 s while kube-state-metrics says the pod runs
  (a container restarted without the hook): StallscopeJobNotWatched fires;
- ``week``: two ranks' counters, rank 0 waiting 8 % of its steps (4 budgets), its best
  cause cpu_throttle for the first half and storage_latency after: the dashboards'
  panels, queried as Grafana sends them over a "last 7 days" range, say how much budget
  the job spent and on what, as injected.

Under a minute and a half; run it under the heavy lock (`flock /tmp/stallscope-heavy.lock`).
"""
import json
import os
import sys
import time

import pytest

from stallscope.lab import findings
from stallscope.mixin import config, generate, promql
from stallscope.processes import children, servers
from tests.helpers.gpu import DcgmServer as MetricsPage  # serves a /metrics page
from tests.helpers.lab import lab_session
from tests.helpers.needs import need_prometheus

pytestmark = pytest.mark.slow

FAST, SLOW, TICKET = ("StallscopeInputGoodputFastBurn", "StallscopeInputGoodputSlowBurn",
                      "StallscopeInputGoodputBudgetBurn")
# The shipped SLO block with every window divided by 120 (1h -> 30s, 5m -> 2.5s, rounded up
# to the 10 s rate window the hook's 2 s reports need), `for:` a few evaluations.
CFG = config.load(
    rate_window="10s", data_wait_for="10s", straggler_for="5s", cause_for="5s", health_for="5s",
    silent_lookback="5m",
    slo={"period": "10m", "burns": [
        {"alert": FAST, "severity": "critical", "long": "30s", "short": "10s", "factor": 14.4, "for": "2s"},
        {"alert": SLOW, "severity": "critical", "long": "3m", "short": "15s", "factor": 6, "for": "2s"},
        {"alert": TICKET, "severity": "warning", "long": "5m", "short": "30s", "factor": 1, "for": "5s"}]})
NS = findings.NAMESPACE
STEP = 0.05          # seconds a step: the loader's wait plus the loop's compute
SEVERE_SHARE = 0.9
MILD_SHARE = 0.05
WEEK_SHARES = (0.08, 0.01)
WEEK_SWITCH = 20.0   # seconds into the week page when its best cause changes

TRAINER = r'''
import os, sys, time
import stallscope
share, flag, stall, seconds = float(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
now = lambda: stall if flag and os.path.exists(flag) else share
def loader():
    while True:
        time.sleep({step} * now())  # the batch is not ready for this long
        yield 0
end = time.monotonic() + seconds
for _ in stallscope.watch(loader()):
    time.sleep({step} * (1 - now()))  # compute
    if time.monotonic() > end:
        break
'''.replace("{step}", repr(STEP))


class WeekPage:
    """The hook's counters of job ``week`` as an agent serves them, growing at exactly
    WEEK_SHARES of the step time, and its rank 0's cause scores."""

    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self):
        t = time.monotonic() - self.t0
        out = []
        for metric in ("stallscope_data_wait_seconds", "stallscope_step_seconds"):
            out.append("# TYPE %s histogram" % metric)
            for rank, share in enumerate(WEEK_SHARES):
                lab = 'job="week",rank="%d",pod="week-%d",namespace="%s",node="n%d"' % (rank, rank, NS, rank)
                n = int(t / STEP)
                out.append('%s_bucket{%s,le="+Inf"} %d' % (metric, lab, n))
                out.append("%s_sum{%s} %.6f" % (metric, lab, t * (share if "wait" in metric else 1.0)))
                out.append("%s_count{%s} %d" % (metric, lab, n))
        cause = "cpu_throttle" if t < WEEK_SWITCH else "storage_latency"
        out.append("# TYPE stallscope_stall_cause_score gauge")
        out.append('stallscope_stall_cause_score{job="week",rank="0",pod="week-0",namespace="%s",node="n0",'
                   'cause="%s"} 0.8' % (NS, cause))
        return "\n".join(out) + "\n"


def _pods_running(pods):
    return "# TYPE kube_pod_status_phase gauge\n" + "".join(
        'kube_pod_status_phase{namespace="%s",pod="%s",phase="Running"} 1\n' % (NS, p) for p in pods)


def _firing(prom, name, job):
    return [a for a in prom.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"
            and a["labels"].get("job") == job]


def _until(what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError("%s not within %.0fs" % (what, timeout))


def _panel_query(board, title, grafana):
    (panel,) = [p for p in board["panels"] if p.get("title") == title]
    (target,) = panel["targets"]
    expr = target["expr"]
    for var in ("namespace", "job", "node", "pod", "rank"):
        expr = expr.replace("$" + var, grafana.get(var, ".*"))
    return (expr.replace("$__range", grafana["range"]).replace("$__interval_ms", "1000")
            .replace("$__interval", "1s"))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    need_prometheus()
    d = tmp_path_factory.mktemp("slo-live")
    rule_files = generate.write(generate.alert_files(CFG), str(d / "rules"))
    script = d / "trainer.py"
    script.write_text(TRAINER)
    flag = str(d / "stall")
    with lab_session(d / "lab") as session:
        td = session.td
        agent = session.start_agent(240, ["--rank-exit-grace", "2"])
        pods = ["severe-0", "severe-1", "mild-0", "healthy-0", "unwatched-0"]
        ksm = MetricsPage(_pods_running(pods))
        td.push("stop the kube-state-metrics page", ksm.close)
        week = MetricsPage(WeekPage())
        td.push("stop the week page", week.close)
        prom = servers.PrometheusProcess([agent.url, ksm.url, week.url], rule_files=rule_files, interval="1s",
                                         workdir=str(d / "prometheus"))
        os.makedirs(prom.dir, exist_ok=True)
        td.push("stop prometheus", prom.stop)
        prom.start()

        def trainer(job, rank, world, share, seconds, stall_flag="", stall=0.0):
            env = {"STALLSCOPE_SOCKET": agent.socket, "STALLSCOPE_JOB": job, "RANK": str(rank),
                   "WORLD_SIZE": str(world), "POD_NAME": "%s-%d" % (job, rank), "POD_NAMESPACE": NS}
            return session.popen("%s rank %d" % (job, rank), str(d / ("%s-%d.log" % (job, rank))),
                                 [sys.executable, str(script), str(share), stall_flag, str(stall),
                                  str(seconds)],
                                 env=children.child_env(env))

        started = time.monotonic()
        for r in (0, 1):
            trainer("severe", r, 2, 0.0, 600, flag if r == 0 else "", SEVERE_SHARE)
        trainer("mild", 0, 1, MILD_SHARE, 600)
        trainer("healthy", 0, 1, 0.0, 600)
        unwatched = trainer("unwatched", 0, 1, 0.0, 8)
        yield dict(prom=prom, flag=flag, started=started, unwatched=unwatched, week_started=week.body.t0)


def test_a_severe_stall_pages_within_its_windows_bound_and_resets_within_its_short_one(live):
    prom = live["prom"]
    n = promql.slo_names(CFG)
    fast = [b for b in CFG.slo.burns if b.alert == FAST][0]
    # a whole long window of healthy steps first, so the page reads the stall, not the start
    prom.wait_for('%s{job="severe"} < 1' % n["burn_" + fast.long], timeout=60)
    time.sleep(max(0.0, config.seconds(fast.long) + 5 - (time.monotonic() - live["started"])))
    assert not _firing(prom, FAST, "severe")
    open(live["flag"], "w").close()
    began = time.monotonic()
    # the bound: the rate window for the worst rank's share to move, then the long
    # window's mean to reach factor x budget at this share, `for:`, and a hook report
    # (2 s), a scrape and two evaluations (rule groups one behind another) at 1 s
    bound = (config.seconds(CFG.rate_window) + config.seconds(fast.long) * fast.factor * CFG.slo.budget
             / SEVERE_SHARE + config.seconds(fast.for_) + 2 + 3)
    (alert,) = _until("%s for job severe" % FAST, lambda: _firing(prom, FAST, "severe"), bound + 30)
    paged = time.monotonic() - began
    os.unlink(live["flag"])
    ended = time.monotonic()
    text = alert["annotations"]["description"]
    print("severe stall (%.0f %% waiting): %s fired %.1f s after it began (bound %.1f s: windows %s/%s, "
          "rate window %s, for %s)" % (SEVERE_SHARE * 100, FAST, paged, bound, fast.long, fast.short,
                                       CFG.rate_window, fast.for_))
    assert paged <= bound, (paged, bound)
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["namespace"] == NS
    assert "the slowest is rank 0 (pod severe-0 on node lab-node)" in text, text
    assert "`stallscope diagnose severe-0 -n %s`" % NS in text
    assert "of the budget over the last 10m is left" in text
    # the stall ended: the short window falls under the factor within itself plus the
    # rate window (and the same reporting/evaluation slack), and the page resolves
    reset_bound = config.seconds(fast.short) + config.seconds(CFG.rate_window) + 2 + 3
    _until("%s resolved" % FAST, lambda: not _firing(prom, FAST, "severe"), reset_bound + 30)
    reset = time.monotonic() - ended
    print("stall over: %s resolved %.1f s later (bound %.1f s)" % (FAST, reset, reset_bound))
    assert reset <= reset_bound, (reset, reset_bound)


def test_a_mild_stall_opens_the_ticket_only(live):
    prom = live["prom"]
    (alert,) = _until("%s for job mild" % TICKET, lambda: _firing(prom, TICKET, "mild"), 90)
    assert alert["labels"]["severity"] == "warning"
    since = int(time.monotonic() - live["started"]) + 5
    fired = {r["metric"]["alertname"] for r in prom.query(
        'max_over_time(ALERTS{job="mild", alertstate="firing"}[%ds])' % since)}
    assert fired <= {TICKET, "StallscopeDataWaitHigh"} and TICKET in fired, fired
    # 2.5x the budget's pace: over the ticket's 1x, under the pages' 6x and 14.4x
    burn = float(prom.query('%s{job="mild"}' % promql.slo_names(CFG)["burn_30s"])[0]["value"][1])
    assert 1 < burn < 6, burn


def test_a_healthy_run_fires_nothing(live):
    prom = live["prom"]
    # after the severe job paged and the mild one's ticket opened: the healthy job ran as long
    _until("the mild job's ticket", lambda: _firing(prom, TICKET, "mild"), 90)
    since = int(time.monotonic() - live["started"]) + 5
    assert prom.query('%s{job="healthy"}' % promql.slo_names(CFG)["burn_10s"]), "the healthy job has no SLI"
    fired = prom.query('max_over_time(ALERTS{job="healthy", alertstate="firing"}[%ds])' % since)
    assert fired == [], fired


def test_a_run_whose_hook_stops_reporting_fires_not_watched(live):
    prom = live["prom"]
    # the trainer with the hook exits after 8 s; the pod, kube-state-metrics says, runs on
    live["unwatched"].wait(30)
    (alert,) = _until("StallscopeJobNotWatched",
                      lambda: _firing(prom, "StallscopeJobNotWatched", "unwatched"), 60)
    assert "e.g. pod unwatched-0 on node lab-node" in alert["annotations"]["description"]
    for job in ("severe", "mild", "healthy"):
        assert not _firing(prom, "StallscopeJobNotWatched", job)


def test_the_dashboards_say_how_much_budget_the_job_spent_this_week_and_on_what(live):
    """The two questions, from the panels alone, over a "last 7 days" range: the budget
    job ``week`` spent (rank 0's 8 % over a 2 % budget: 4 budgets), the accelerator-hours
    it lost by cause (2 ranks x 8 % x the seconds each cause was the best, / 3600), and the
    budget by cause in the same proportion; the fleet ranks it by budget spent."""
    prom = live["prom"]
    time.sleep(max(0.0, WEEK_SWITCH + 15 - (time.monotonic() - live["week_started"])))
    boards = {k[:-5]: json.loads(v) for k, v in generate.dashboard_files(CFG).items()}
    grafana = {"namespace": NS, "job": "week", "range": "7d"}
    overview = boards["stallscope-overview"]
    t_query = time.monotonic()
    spent = prom.query(_panel_query(overview, "Error budget spent over the time range", grafana))
    assert float(spent[0]["value"][1]) == pytest.approx(WEEK_SHARES[0] / CFG.slo.budget, rel=0.01), spent
    # the seconds each cause held, as the page served it (first scrape to now)
    n = promql.names(CFG)
    seconds = float(prom.query('count_over_time(%s{job="week"}[7d])' % n["job_idle"])[0]["value"][1])
    elapsed = t_query - live["week_started"]
    expected = {"cpu_throttle": WEEK_SWITCH - (elapsed - seconds), "storage_latency": elapsed - WEEK_SWITCH}
    lost = {r["metric"]["cause"]: float(r["value"][1]) for r in prom.query(
        _panel_query(overview, "Accelerator-hours lost by cause over the time range", grafana))}
    per_second = len(WEEK_SHARES) * WEEK_SHARES[0] / 3600  # world size x the straggler's share
    print("week: budget spent %.3f; hours lost by cause %s; expected %s" % (
        float(spent[0]["value"][1]), lost, {c: s * per_second for c, s in expected.items()}))
    assert set(lost) == set(expected), lost
    for cause, s in expected.items():
        # each second one evaluation (1 s): a cause's seconds +- 2 evaluations and a scrape
        assert lost[cause] == pytest.approx(s * per_second, abs=3 * per_second), (cause, lost)
    by_cause = {r["metric"]["cause"]: float(r["value"][1]) for r in prom.query(
        _panel_query(overview, "Error budget spent by cause over the time range", grafana))}
    total = sum(lost.values())
    for cause in expected:
        assert by_cause[cause] == pytest.approx(
            WEEK_SHARES[0] / CFG.slo.budget * lost[cause] / total, rel=0.02), by_cause
    fleet = prom.query(_panel_query(boards["stallscope-fleet"], "Jobs by error budget spent",
                                    {"namespace": NS, "range": "7d"}))
    ranked = [r["metric"]["job"] for r in sorted(fleet, key=lambda r: -float(r["value"][1]))]
    # severe (its stall) and week (4 budgets) before mild (~2.5), before healthy (~0)
    assert set(ranked[:2]) == {"severe", "week"} and ranked.index("mild") < ranked.index("healthy"), fleet
