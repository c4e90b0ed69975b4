"""Do the headline alert and diagnose agree? The lab's check that one rule set judges
both (a firing StallscopeDataWaitHigh means no judged rank is healthy; a silent one
means healthy, or a verdict with a reason the alert does not see), and the alert's own
SLI computed for a run without Prometheus.
"""
from ..vocabulary import DATA_WAIT_LINE

HEADLINE = "StallscopeDataWaitHigh"


def sli_alert(history, rate_window, for_s, line=DATA_WAIT_LINE):
    """The headline alert computed from its own SLI, as the lab's rules would evaluate it
    (for a run without Prometheus, and for the numbers behind an explanation): at each
    sample, every rank's data-wait seconds over step seconds in the last ``rate_window``
    (the agent's counters, which the alert's histograms count alike), the job's worst
    rank against ``line``; firing once that held for ``for_s``. ``history``: [(seconds
    since the window began, {rank: counters})], the runner's samples every second.
    Returns {firing, peak_ratio, longest_over_s, rate_window_s, for_s, source}."""
    w, need = rate_window, for_s
    peak, longest, since, firing = None, 0.0, None, False
    for i, (t, now) in enumerate(history):
        past = [h for h in history[:i] if h[0] <= t - w + 0.5]
        if not past:
            continue
        then = past[-1][1]
        ratios = []
        for rank, n in now.items():
            b = then.get(rank)
            if not b:
                continue
            steps = n["step_seconds_total"] - b["step_seconds_total"]
            if steps > 0:
                ratios.append((n["data_wait_seconds_total"] - b["data_wait_seconds_total"]) / steps)
        worst = max(ratios) if ratios else None
        if worst is not None:
            peak = worst if peak is None else max(peak, worst)
        if worst is not None and worst > line:
            since = t if since is None else since
            longest = max(longest, t - since)
            firing = firing or t - since >= need
        else:
            since = None
    return {"firing": firing, "peak_ratio": None if peak is None else round(peak, 4),
            "longest_over_s": round(longest, 1), "rate_window_s": w, "for_s": need, "source": "sli"}


def _pct(x):
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def agreement(alert, judged, line=DATA_WAIT_LINE):
    """Do the headline alert and diagnose's verdicts agree? ``alert``: {firing, source,
    and, from sli_alert, peak_ratio, longest_over_s, rate_window_s, for_s}; ``judged``:
    the ranks diagnose judged (rank 0's report, then the straggler's), each {rank,
    verdict, data_wait_ratio, job_max_data_wait_ratio}. Firing: every judged rank must
    be input_bound or not_input_bound (a rule set that says healthy, or has no verdict,
    disagrees). Silent: healthy agrees; another verdict is explained when the alert could
    not see it (a rank waiting outside the loader, under the line; a stall over the line
    in diagnose's window that never held over it for the alert's ``for`` in its short
    windows; too few batches for a verdict), and disagrees otherwise. Returns {state:
    agree | explained | disagree, alert, source, verdicts, why}."""
    verdicts = [(j.get("rank"), j.get("verdict")) for j in judged]
    out = {"alert": "firing" if alert.get("firing") else "silent", "source": alert.get("source"),
           "verdicts": ["%s:%s" % rv for rv in verdicts]}
    if not judged:
        return dict(out, state="disagree", why="diagnose judged no rank")
    if alert.get("firing"):
        bad = [(r, v) for r, v in verdicts if v not in ("input_bound", "not_input_bound")]
        if bad:
            why = "%s fired, yet diagnose found %s" % (HEADLINE, ", ".join(
                "rank %s %s" % (r, "healthy" if v == "healthy" else "without a verdict (%s)" % v)
                for r, v in bad))
            worst = max((j.get("job_max_data_wait_ratio") or j.get("data_wait_ratio") or 0.0
                         for j in judged), default=None)
            if alert.get("peak_ratio") is not None:
                why += (" (over %ss windows the job's worst rank peaked at %s and stayed over the "
                        "line %ss; over diagnose's window it waited %s)" % (
                            _num(alert.get("rate_window_s")), _pct(alert["peak_ratio"]),
                            _num(alert.get("longest_over_s")), _pct(worst)))
            return dict(out, state="disagree", why=why)
        return dict(out, state="agree", why="%s fired and no judged rank is healthy" % HEADLINE)
    whys = []
    for j in judged:
        v, mine, job = j.get("verdict"), j.get("data_wait_ratio"), j.get("job_max_data_wait_ratio")
        worst = max((x for x in (mine, job) if x is not None), default=None)
        if v == "healthy":
            continue
        if v == "unknown":
            whys.append("rank %s has no verdict (too few batches)" % j.get("rank"))
        elif worst is not None and worst < line and v == "not_input_bound":
            whys.append("rank %s waits outside its loader (data-wait %s, job's worst %s: under "
                        "the line), which the alert does not page on" % (j.get("rank"), _pct(mine),
                                                                        _pct(worst)))
        elif worst is not None and worst >= line and alert.get("longest_over_s") is not None \
                and alert["longest_over_s"] < alert.get("for_s", 0):
            whys.append("rank %s is %s: the job's worst rank waited %s over diagnose's window, but "
                        "over %ss windows it stayed over the line %ss at most (the alert's for: %ss)"
                        % (j.get("rank"), v, _pct(worst), _num(alert.get("rate_window_s")),
                           _num(alert["longest_over_s"]), _num(alert.get("for_s"))))
        else:
            return dict(out, state="disagree", why="%s stayed silent, yet diagnose found rank %s %s "
                        "(data-wait %s, job's worst %s)" % (HEADLINE, j.get("rank"), v, _pct(mine),
                                                           _pct(worst)))
    if not whys:
        return dict(out, state="agree", why="%s silent and every judged rank healthy" % HEADLINE)
    return dict(out, state="explained", why="; ".join(whys))


def _num(x):
    return "?" if x is None else "%g" % x


def judged_ranks(details):
    """The ranks diagnose judged, for agreement(): from ``stallscope diagnose``'s reports
    (rank 0's, then the straggler's), or, when it could not answer, every rank's diagnosis
    by the agent (``details`` is then {rank: /api/v1/diagnosis})."""
    keys = ("rank", "verdict", "data_wait_ratio", "job_max_data_wait_ratio")
    if details and "report" in details:
        return [{k: d.get(k) for k in keys} for d in (details.get("first"), details["report"]) if d]
    out = []
    for rank, d in sorted((details or {}).items()):
        peers = [p.get("data_wait_ratio") for p in d.get("job_ranks_on_node") or []]
        known = [r for r in [d.get("data_wait_ratio")] + peers if r is not None]
        out.append({"rank": rank, "verdict": d.get("verdict"), "data_wait_ratio": d.get("data_wait_ratio"),
                    "job_max_data_wait_ratio": max(known) if known else None})
    return out
