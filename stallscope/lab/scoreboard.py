"""``stallscope lab scoreboard``: every scenario in sequence, one row each: expected
cause vs diagnosed cause, the rank named, whether the alerts matched, and whether the
headline alert and diagnose's verdicts agree (findings.agreement: ``agree``,
``explained`` when a silent alert has a reason, ``DISAGREE``)."""
import json
import sys

from . import runner, scenarios, teardown


def row(name, result=None, skipped=None):
    if result is None:
        return {"scenario": name, "expected_cause": scenarios.get(name).cause, "found_cause": None,
                "expected_rank": None, "found_rank": None, "alerts": None, "agreement": None,
                "ok": None, "skipped": skipped}
    alerts = result["alerts"]
    return {"scenario": name, "expected_cause": result["expected"]["cause"],
            "found_cause": result["found"]["cause"], "expected_rank": result["expected"]["rank"],
            "found_rank": result["found"]["rank"],
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
        if detail.get("state") in ("explained", "disagree"):
            lines.append("%-22s   alert~verdict: %s" % ("", detail["why"]))
    done = [r for r in rows if not r["skipped"]]
    lines.append("%d/%d scenarios ok, %d skipped (rank column: named/injected; alert~verdict: "
                 "StallscopeDataWaitHigh vs diagnose's verdicts%s)" % (
                     sum(1 for r in done if r["ok"]), len(done), len(rows) - len(done),
                     _sources(done)))
    return "\n".join(lines) + "\n"


def _sources(done):
    found = sorted({(r.get("agreement_detail") or {}).get("source") for r in done} - {None})
    names = {"prometheus": "alert from Prometheus", "sli": "alert computed from the SLI, no Prometheus"}
    return "".join("; " + names.get(s, s) for s in found)


def scoreboard(names, ranks, duration, as_json, prometheus, record):
    rows = []
    for name in names:
        opts = runner.Options(ranks=ranks, duration=duration, prometheus=prometheus, record=record)
        try:
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
