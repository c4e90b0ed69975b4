"""``stallscope lab scoreboard``: every scenario in sequence, one row each: expected
cause vs diagnosed cause, the rank named, whether the alerts matched, and whether the
headline alert and diagnose's verdicts agree (agreement.py: ``agree``,
``explained`` when a silent alert has a reason, ``DISAGREE``).

With ``--apply-fix`` each scenario is also rerun with diagnose's predicted change
(lab/applyfix.py) and a second table puts predicted beside measured. It is opt-in: a
rerun (two for a CPU limit) per scenario makes the scoreboard take two to three times as
long (~2.4 min a scenario with it on the lab's loaded 2-core machine: every real scenario
~45 min, against ~20 without)."""
import json
import sys

from ..processes import teardown
from ..vocabulary import DATA_WAIT_LINE
from . import applyfix, runner, scenarios

STEP_ERROR = 0.15  # issue 17: the predicted step within 15 % of the measured one


def row(name, result=None, skipped=None):
    out = _row(name, result, skipped)
    if result is not None and result.get("fix") is not None:
        out["fix"] = result["fix"]
    return out


def _row(name, result=None, skipped=None):
    if result is None:
        return {"scenario": name, "expected_cause": scenarios.get(name).cause, "found_cause": None,
                "expected_rank": None, "found_rank": None, "alerts": None, "agreement": None,
                "ok": None, "skipped": skipped}
    alerts = result["alerts"]
    return {"scenario": name, "expected_cause": result["expected"]["cause"],
            "found_cause": result["found"]["cause"], "expected_rank": result["expected"]["rank"],
            "found_rank": result["found"]["rank"],
            "expected_worker_pid": result["expected"].get("worker_pid"),
            "found_worker_pid": result["found"].get("worker_pid"),
            # the other diagnose path, Prometheus alone, where the run took it (findings.py)
            "found_cause_prometheus_alone": (result["found"].get("prometheus_alone") or {}).get("cause"),
            "beside": result.get("beside"),
            "alerts": None if alerts is None else alerts["matched"],
            "alerts_fired": None if alerts is None else alerts["fired"],
            "agreement": (result.get("agreement") or {}).get("state"),
            "agreement_detail": result.get("agreement"),
            "worst_wait_ratio": max((r["data_wait_ratio"] or 0) for r in result["ranks"]),
            "ok": result["ok"], "skipped": None}


def _fmt(v):
    return "-" if v is None else str(v)


AGREEMENT = {"agree": "agree", "explained": "explained", "disagree": "DISAGREE", None: "-"}
_ROW = "%-22s %-22s %-22s %-6s %-7s %-13s %s"


def render(rows):
    head = _ROW % ("scenario", "expected cause", "diagnosed cause", "rank", "alerts", "alert~verdict",
                   "result")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["skipped"]:
            lines.append(_ROW % (r["scenario"], _fmt(r["expected_cause"] or "none"), "-", "-", "-", "-",
                                 "skipped: " + r["skipped"]))
            continue
        rank = "%s/%s" % (_fmt(r["found_rank"]), _fmt(r["expected_rank"]))
        alerts = {True: "match", False: "MISS", None: "n/a"}[r["alerts"]]
        lines.append(_ROW % (r["scenario"], r["expected_cause"] or "none", r["found_cause"] or "none", rank,
                             alerts, AGREEMENT[r.get("agreement")], "ok" if r["ok"] else "NOT OK"))
        detail = r.get("agreement_detail") or {}
        if r.get("found_cause_prometheus_alone") is not None:
            lines.append("%-22s   through Prometheus alone: %s" % ("", r["found_cause_prometheus_alone"]))
        if r.get("beside"):
            b = r["beside"]
            said = ", ".join("%s %s" % (pod, "/".join(v)) for pod, v in sorted(b["verdicts"].items()))
            lines.append("%-22s   beside it, job %s: %s (expected %s)" % ("", b["job"], said,
                                                                        b["expected_verdict"]))
        if r.get("expected_worker_pid") is not None:
            lines.append("%-22s   worker named/slowed: pid %s/%s" % (
                "", _fmt(r.get("found_worker_pid")), r["expected_worker_pid"]))
        if detail.get("state") in ("explained", "disagree"):
            lines.append("%-22s   alert~verdict: %s" % ("", detail["why"]))
    done = [r for r in rows if not r["skipped"]]
    lines.append("%d/%d scenarios ok, %d skipped (rank column: named/injected; alert~verdict: "
                 "StallscopeDataWaitHigh vs diagnose's verdicts%s)" % (
                     sum(1 for r in done if r["ok"]), len(done), len(rows) - len(done),
                     _sources(done)))
    fixes = [r for r in rows if r.get("fix") is not None]
    if fixes:
        lines += [""] + render_fixes(fixes)
    return "\n".join(lines) + "\n"


_FIX = "%-22s %-44s %-15s %-15s %-7s %s"


def render_fixes(rows):
    """The apply-fix table: the change diagnose predicted, predicted vs measured data-wait
    and step after it, the step error, and the machine's floor (the wait of the ranks
    without the fault in the same rerun)."""
    head = _FIX % ("scenario", "change", "wait pred/meas", "step pred/meas", "error", "peers' wait")
    lines = [head, "-" * len(head)]
    for r in rows:
        f = r["fix"]
        if f.get("error"):
            lines.append("%-22s no rerun: %s" % (r["scenario"], f["error"]))
            continue
        lines.append(_FIX % (r["scenario"], f["change"][:44],
                             "%s/%s" % (_pc(f["predicted_data_wait_ratio"]),
                                        _pc(f["measured_data_wait_ratio"])),
                             "%s/%s" % (_s(f["predicted_step_seconds"]), _s(f["measured_step_seconds"])),
                             _pc(f["step_error"], signed=True), _pc(f.get("peers_data_wait_ratio"))))
    gone = [r for r in rows if not r["fix"].get("error")]
    lines.append("%d/%d fixes took the wait under the %.0f%% line, %d within %.0f%% of the predicted step"
                 % (sum(1 for r in gone if r["fix"]["stall_gone"]), len(gone), 100 * DATA_WAIT_LINE,
                    sum(1 for r in gone if r["fix"]["step_error"] is not None
                        and abs(r["fix"]["step_error"]) <= STEP_ERROR), 100 * STEP_ERROR))
    return lines


def _pc(x, signed=False):
    return "-" if x is None else ("%+.1f%%" if signed else "%.1f%%") % (100 * x)


def _s(x):
    return "-" if x is None else "%.3fs" % x


def _sources(done):
    found = sorted({(r.get("agreement_detail") or {}).get("source") for r in done} - {None})
    names = {"prometheus": "alert from Prometheus", "sli": "alert computed from the SLI, no Prometheus"}
    return "".join("; " + names.get(s, s) for s in found)


def scoreboard(names, ranks, duration, as_json, prometheus, record, apply_fix=False):
    rows = []
    for name in names:
        opts = runner.Options(ranks=ranks, duration=duration, prometheus=prometheus, record=record)
        try:
            if apply_fix:
                rows.append(row(name, applyfix.run(scenarios.get(name), opts, runner.run)))
            else:
                rows.append(row(name, runner.run(scenarios.get(name), opts)))
        except runner.Unavailable as e:
            rows.append(row(name, skipped=str(e).split(" ", 1)[1]))
        except teardown.Interrupted as e:
            print("stallscope lab: interrupted by %s; everything the run created was removed" % e,
                  file=sys.stderr)
            return e.exit_code
        except (RuntimeError, TimeoutError, OSError) as e:
            r = row(name)
            r.update(ok=False, skipped=None, error=str(e).strip().splitlines()[0])
            rows.append(r)
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        sys.stdout.write(render(rows))
    return 0 if all(r["ok"] for r in rows if not r["skipped"]) else 1
