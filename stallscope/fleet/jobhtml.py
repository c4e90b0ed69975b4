"""``stallscope report --job --html``: the life of one job as one self-contained page,
like ``stallscope run``'s (the same style; the timeline plot inlined as a PNG data URI,
no script, no external file): the headline figures, the timeline of the job's worst
rank's waiting share and the accelerators idle, hours lost by cause, the worst periods,
the stragglers that recurred, the loader settings and their changes (issue 36, item 2).
From the typed JobReport alone; matplotlib is imported only for the plot."""
from __future__ import annotations

import base64
import html

from .. import figure
from ..diagnose import window as durations
from ..figure import PlotError as PlotError  # what callers catch: the one error of figure.py
from ..run.html import STYLE, table
from .jobreport import JobReport, when


def plot(r: JobReport, path: str, warning_line: float | None = None) -> str:
    """The report's timeline as a PNG at ``path``; PlotError when it cannot be drawn."""
    figure.pyplot()  # matplotlib missing: say so before looking at the samples
    if not r.timeline:
        raise PlotError("no samples in the period")
    t0 = r.timeline[0][0]
    x = [(t - t0) / 60 for t, _, _ in r.timeline]
    with figure.drawn(path) as (_fig, ax):
        from matplotlib.ticker import PercentFormatter
        ax.fill_between(x, [100 * w for _, w, _ in r.timeline], step="post", color="tab:red", alpha=0.45,
                        label="the job's worst rank: data-wait share")
        if warning_line is not None:
            ax.axhline(100 * warning_line, color="grey", ls=":", lw=1,
                       label="warning line (%.0f%%)" % (100 * warning_line))
        ax.set_ylim(0, 105)
        ax.yaxis.set_major_formatter(PercentFormatter(100))
        ax.set_ylabel("share of step time")
        ax.set_xlabel("minutes since %s" % when(t0))
        idle = ax.twinx()
        idle.plot(x, [a for _, _, a in r.timeline], color="tab:blue", lw=1.4, drawstyle="steps-post",
                  label="accelerators idle on input")
        idle.set_ylim(0, max(1.0, r.ranks) * 1.05)
        idle.set_ylabel("accelerators idle")
        lines = ax.get_legend_handles_labels()
        more = idle.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize=8)
        ax.set_title("job %s: %.3f of %.3f accelerator-hours lost to input wait" % (
            r.job, r.lost_accelerator_hours, r.accelerator_hours))
    return path


def _e(x: object) -> str:
    return html.escape("" if x is None else str(x))


def page(r: JobReport, png_path: str | None = None, plot_note: str | None = None) -> str:
    """The page; ``png_path``: the plot to inline (plot()), else ``plot_note`` says why none."""
    if png_path:
        with open(png_path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        timeline = '<img id="timeline" alt="timeline" src="data:image/png;base64,%s">' % data
    else:
        timeline = "<p>No timeline plot: %s.</p>" % _e(plot_note or "none drawn")
    share = "%.1f%%" % (100 * r.lost_share) if r.lost_share is not None else "-"
    causes = table(["cause", "accelerator-hours lost"],
                   [(c, "%.4f" % v) for c, v in sorted(r.lost_by_cause.items(), key=lambda x: -x[1])])
    periods = table(["from", "to", "accelerator-hours lost", "worst rank's data-wait", "cause"],
                    [(when(p.start), when(p.end), "%.4f" % p.lost_accelerator_hours,
                      "%.1f%%" % (100 * p.max_data_wait_ratio), p.cause or "no cause scored")
                     for p in r.worst_periods])
    recurring = {(s.rank, s.pod) for s in r.recurring_stragglers}
    ranks = table(["rank", "pod", "node", "mean data-wait",
                   "the job's worst rank, of its time over the line"],
                  [(s.rank, s.pod, s.node, "%.1f%%" % (100 * s.mean_data_wait_ratio),
                    "%.0f%%" % (100 * s.straggler_share)) for s in r.ranks_life],
                  ["over" if (s.rank, s.pod) in recurring else "" for s in r.ranks_life])
    keys = sorted({k for s in r.settings for k in s})
    settings = (table(keys, [[s.get(k, "") for k in keys] for s in r.settings]) if r.settings
                else "<p>None reported.</p>")
    changes = "".join("<li>rank %s at %s: %s</li>" % (_e(c.rank), _e(when(c.at)), _e(", ".join(
        "%s %s -> %s" % (k, c.before.get(k), c.after.get(k)) for k in sorted(set(c.before) | set(c.after))
        if c.before.get(k) != c.after.get(k)))) for c in r.changes)
    cost = ", cost %.2f" % r.cost if r.cost is not None else ""
    return """<!doctype html><html><head><meta charset="utf-8"><title>stallscope report: %(job)s</title>
<style>%(style)s</style></head><body>
<h1>stallscope report: job <code>%(job)s</code></h1>
<p>%(start)s to %(end)s (%(wall)s), %(ranks)d ranks at most</p>
<div class="verdict">%(lost).3f of %(hours).3f accelerator-hours lost to input wait (%(share)s)%(cost)s</div>
<h2>Timeline</h2>%(timeline)s
<h2>Lost by cause</h2>%(causes)s
<h2>Worst periods</h2>%(periods)s
<h2>Ranks</h2>%(ranks_table)s
<h2>Loader settings</h2>%(settings)s%(changes)s
</body></html>
""" % {"job": _e(("%s/" % r.namespace if r.namespace else "") + r.job), "style": STYLE,
       "start": _e(when(r.start)), "end": _e(when(r.end)), "wall": _e(durations.human(r.wall_seconds)),
       "ranks": r.ranks, "lost": r.lost_accelerator_hours, "hours": r.accelerator_hours, "share": _e(share),
       "cost": _e(cost), "timeline": timeline, "causes": causes, "periods": periods, "ranks_table": ranks,
       "settings": settings, "changes": "<h3>Changes</h3><ul>%s</ul>" % changes if changes else ""}
