"""The HTML report of ``stallscope run``: one self-contained page (the timeline plot
inlined as a PNG data URI, no script, no external file) with the training's failure
first when it failed, the verdict with the rank's data-wait, the evidence table, the
causes with their fixes (the vocabulary's advice and runbook), the prediction, headroom
and cost lines (the text report's own, diagnose/outlook.py), the per-rank summary and
the next steps. The same document as the JSON report, for people: the Ranks table's
figure for the reported rank is the headline's (issue 34: 37.5 % against 38.8 %)."""
import base64
import html

from .. import vocabulary
from ..correlate import capacity
from ..diagnose import outlook, render

STYLE = """
body{font-family:DejaVu Sans,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px} h2{font-size:17px;margin-top:26px}
.verdict{font-size:18px;font-weight:bold;padding:8px 12px;background:#f2f2f2;border-left:6px solid #888}
.failed{font-size:17px;font-weight:bold;padding:8px 12px;background:#fde2e0;border-left:6px solid #c0392b}
.input_bound{border-color:#c0392b} .healthy{border-color:#27ae60} .not_input_bound{border-color:#e67e22}
table{border-collapse:collapse;margin-top:6px} th{background:#1f4e79;color:#fff;text-align:left}
th,td{padding:5px 10px;border:1px solid #bbb;font-size:13px} tr.over td{background:#fde2e0}
tr.reported td{font-weight:bold}
img{max-width:100%;border:1px solid #ccc}
"""


def _e(x):
    return html.escape("" if x is None else str(x))


def table(headers, rows, classes=None):
    head = "".join("<th>%s</th>" % _e(h) for h in headers)
    body = "".join('<tr class="%s">%s</tr>' % (_e((classes or [""] * len(rows))[i]),
                                                "".join("<td>%s</td>" % _e(c) for c in r))
                   for i, r in enumerate(rows))
    return "<table><tr>%s</tr>%s</table>" % (head, body)


def _evidence(report):
    rows, classes = [], []
    for r in report.evidence:
        rows.append((r.signal, render.value(r.signal, r.value), render._threshold(r),
                     render._status(r), r.source))
        classes.append("over" if r.status == "over" else "")
    return table(("signal", "value", "threshold", "status", "source"), rows, classes)


def _causes(report):
    rows = []
    for c in report.causes:
        if round(c.score, 2) <= 0:  # printed as 0.00: no finding (issue 52)
            continue
        known = vocabulary.CAUSE.get(c.cause)
        rows.append((c.cause, "%.2f" % c.score, c.summary or "",
                     known.advice if known else "", known.runbook if known else ""))
    if not rows:
        return "<p>No cause scored.</p>"
    return table(("cause", "score", "finding", "fix", "runbook"), rows)


def _budget(report):
    """Where the stall's wait went (correlate/budget.py): each measured component, its
    share of the wait and the cause it names, and what bounds the prediction."""
    b = report.budget if report is not None else None
    if b is None or not b.components:
        return ""
    rows = [("%.0f%%" % (100 * c.share), "%.3gs" % c.seconds, c.words, c.cause or "-")
            for c in b.components if c.share >= 0.01]
    text = ("<p>%.3gs of waiting: %.0f%% for a batch to be ready, %.0f%% handing batches over" % (
        b.wait_seconds, 100 * b.ready_seconds / b.wait_seconds, 100 * b.handoff_seconds / b.wait_seconds))
    if b.workers_idle is not None:
        text += "; the workers were idle %.0f%% of their time" % (100 * b.workers_idle)
    p = report.prediction
    bound = "<p>The prediction is bound by the %s.</p>" % _e(capacity.NAMES.get(p.bound_by, p.bound_by)) \
        if p is not None and p.bound_by else ""
    return "<h2>Time budget of the wait</h2>%s.</p>%s%s" % (
        text, table(("share", "seconds", "component", "cause"), rows), bound)


def _ranks(report, ran):
    """The run's ranks; the reported one marked. Its data-wait is the report's own figure
    (session.final_rows), shown with the headline's rounding."""
    rows = ran.ranks
    several = len({r.job for r in rows}) > 1
    out, classes = [], []
    for r in rows:
        reported = r.rank == report.rank and r.job == report.job
        out.append(((r.job,) if several else ()) + (
            r.rank, r.batches, render.value("x_ratio", r.data_wait_ratio),
            "%.2f" % r.batches_per_second if r.batches_per_second else "n/a",
            r.verdict or "", r.cause or "", "<- reported" if reported else ""))
        classes.append("reported" if reported else "")
    headers = (("job",) if several else ()) + ("rank", "batches", "data-wait", "batches/s",
                                               "verdict", "top cause", "")
    return table(headers, out, classes)


def _outlook(doc):
    told = outlook.lines(doc)
    if not told:
        return ""
    return "<h2>Prediction, headroom and cost</h2><ul>%s</ul>" % "".join(
        "<li>%s</li>" % _e(t.strip()) for t in told)


def page(report, ran, png_path=None):
    """The run's page: ``report``, the typed diagnose Report of its worst rank
    (diagnose/document.py); ``ran``, the RunOutcome (outcome.py)."""
    plot = "<p>No timeline plot (matplotlib missing or no batches in the window).</p>"
    if png_path:
        with open(png_path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        plot = '<img id="timeline" alt="timeline" src="data:image/png;base64,%s">' % data
    steps = "".join("<li>%s%s</li>" % (_e(s.step), " [%s]" % _e(s.runbook) if s.runbook else "")
                    for s in report.next_steps)
    notes = "".join("<li>%s</li>" % _e(w) for w in report.warnings)
    gpu = report.gpu.source if report.gpu is not None else None
    return """<!doctype html><html><head><meta charset="utf-8"><title>stallscope run: %(title)s</title>
<style>%(style)s</style></head><body>
<h1>stallscope run: <code>%(cmd)s</code></h1>
%(failed)s<p>exit status %(code)s after %(elapsed)ss; GPU signal: %(gpu)s</p>
<div class="verdict %(verdict)s">%(headline)s<br>data-wait %(share)s of the step time</div><p>%(reason)s</p>
<h2>Timeline of the worst rank</h2>%(plot)s
<h2>Evidence</h2>%(evidence)s
%(budget)s
<h2>Causes and fixes</h2>%(causes)s
%(outlook)s
<h2>Ranks</h2>%(ranks)s
<h2>Next steps</h2><ul>%(steps)s</ul>%(notes)s
</body></html>
""" % {"title": _e(report.verdict), "style": STYLE, "cmd": _e(" ".join(ran.command)),
       "code": _e(ran.exit_status), "elapsed": _e(ran.elapsed_seconds),
       "gpu": _e(gpu or "none (no NVML on this machine)"), "verdict": _e(report.verdict),
       "headline": _e(render.headline(report)), "reason": _e(report.reason), "plot": plot,
       "evidence": _evidence(report), "budget": _budget(report), "causes": _causes(report),
       "ranks": _ranks(report, ran), "steps": steps,
       "notes": "<h2>Notes</h2><ul>%s</ul>" % notes if notes else "",
       "failed": '<div class="failed">%s</div>' % _e(ran.outcome_line) if ran.outcome_line else "",
       "share": _e(render.value("x_ratio", report.data_wait_ratio)), "outlook": _outlook(report)}
