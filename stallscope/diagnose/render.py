"""The report as people read it: the verdict in one line, the evidence table, the
causes ranked, the slowest ranks, what to do next and the commands for a deeper look.
``--json`` prints the document itself (report.py)."""
from __future__ import annotations

import datetime
import json
from typing import Any

from . import document, nextsteps, outlook, verdict, window
from .document import EvidenceRow, Report

VERDICT_LINE = {
    "input_bound": "INPUT-BOUND",
    "not_input_bound": "NOT INPUT-BOUND (waits for another rank)",
    "healthy": "HEALTHY",
    "unknown": "UNKNOWN",
}


def value(signal: str | None, v: Any, unit: str | None = None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    s = signal or ""
    if s.endswith("_ratio") or unit == "ratio":
        return "%.1f%%" % (100 * v)
    if s.endswith("_seconds") or s.endswith("seconds / num_workers"):
        return "%.3gs" % v
    if s.endswith("bytes_rate"):
        return "%.3g MB/s" % (v / 1e6)
    if s.endswith("_factor"):
        return "%.2gx" % v
    if isinstance(v, float) and not v.is_integer():
        return "%.3g" % v
    return "%d" % v


def table(headers: Any, rows: Any) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    def line(r: Any) -> str:
        return "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def _clock(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def _threshold(row: EvidenceRow) -> str:
    t = row.threshold
    if t is None:
        return ""
    mark = {"above": ">", "below": "<", "equal": "="}.get(row.direction, "")
    if row.signal in ("stall_period_steps", "workers_needed"):
        return "%snum_workers %s" % (mark, t)
    if row.signal.endswith("_factor"):
        return "%s%gx median" % (mark, t)
    return "%s%s" % (mark, value(row.signal, t))


def _status(row: EvidenceRow) -> str:
    return {"over": "OVER", "ok": "ok", "info": "-", "n/a": "-"}.get(row.status, row.status or "")


def headline(doc: Report) -> str:
    # no "(ns ?)": a run outside Kubernetes has no namespace (issue 52)
    who = "pod %s%s: job %s, rank %s, node %s" % (
        doc.pod, " (ns %s)" % doc.namespace if doc.namespace else "", doc.job or "?", doc.rank,
        doc.node or "?")
    line = VERDICT_LINE.get(doc.verdict, doc.verdict)
    if verdict.keeps_up(doc) and doc.handoff_ratio is not None:
        line += " (the loader keeps up; the per-batch handoff costs %.1f%% of the step)" % (
            100 * doc.handoff_ratio)
    return "%s — %s" % (line, who)


def ended_line(doc: Report) -> str:
    """The report's first line when the job had ended (report.py, ended.py)."""
    assert doc.ended_at is not None
    return "The job ended at %s (its last batch; its agent no longer tracks the rank); its last %s:" % (
        datetime.datetime.fromtimestamp(doc.ended_at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        _span(doc.window_seconds))


def _span(seconds: float) -> str:
    """``5 minutes``, ``90 seconds``, ``1 hour``."""
    for unit, n in (("hour", 3600), ("minute", 60)):
        if seconds >= n and seconds % n == 0:
            k = int(seconds // n)
            return "%d %s%s" % (k, unit, "" if k == 1 else "s")
    return "%d seconds" % seconds


def render_text(doc: Report) -> str:
    out = [ended_line(doc)] if doc.ended_at is not None else []
    out += [headline(doc), doc.reason or ""]
    since = doc.since
    if since is not None and since.above_threshold and since.since is not None:
        out.append("%s over the %s line since %s%s (%s)." % (
            "This rank has been" if since.rank == doc.rank else
            "The straggler (rank %s) has been" % since.rank,
            value("x_ratio", doc.threshold), "before " if since.open_ended else "",
            _clock(since.since), window.human(since.for_seconds or 0.0)))
    for w in doc.warnings:
        out.append("note: %s" % w)
    err = doc.loader_error
    if err is not None:
        out += ["", "Loader error: %s" % err.text]
    if doc.setup_warnings:
        out += ["", "Set-up warnings (at the first batch; not a verdict)"]
        for sw in doc.setup_warnings:
            out.append("  ! %s: %s Fix: %s" % (sw.check, sw.text, sw.fix))
    elif doc.checks_note:
        out += ["", doc.checks_note]

    out += ["", "Evidence (window %s)" % window.human(doc.window_seconds)]
    rows = []
    for r in doc.evidence:
        name = r.signal
        if name == "data_wait_ratio" and r.rank is not None:
            name = "data_wait_ratio (rank %s)" % r.rank
        if r.outside_stalls is not None:
            name += " [outside stalls %s]" % value(r.signal, r.outside_stalls)
        rows.append((name, value(r.signal, r.value), _threshold(r), _status(r), r.source))
    out += ["  " + line for line in table(("signal", "value", "threshold", "status", "source"), rows)]
    if doc.job_scope == "node":
        out.append("  (job max and median cover this node's ranks only: no cluster view)")

    spent = doc.budget
    if spent is not None and spent.components:
        out += ["", "Time budget of the wait (%.3gs: %.0f%% waiting for a batch to be ready, %.0f%% "
                "handing batches over)" % (spent.wait_seconds, 100 * spent.ready_seconds / spent.wait_seconds,
                                          100 * spent.handoff_seconds / spent.wait_seconds)]
        out += ["  %3.0f%%  %-52s %s" % (100 * c.share, c.words, "-> " + c.cause if c.cause else "")
                for c in spent.components if c.share >= 0.01]
        if spent.workers_idle is not None:
            out.append("  (the workers were idle, waiting for work, %.0f%% of their time)"
                       % (100 * spent.workers_idle))

    # those that print as a score: 0.00 is none (issue 52); the JSON keeps them all
    causes = [c for c in doc.causes if round(c.score, 2) > 0]
    if causes:
        out += ["", "Likely causes"]
        for i, c in enumerate(causes[:5], 1):
            out.append("  %d. %-21s %.2f  %s" % (i, c.cause, c.score, c.summary or ""))

    told = outlook.lines(doc)
    if told:
        out += [""] + told

    top = doc.top_ranks
    if top:
        out += ["", "Slowest ranks of job %s (%s)" % (
            doc.job, outlook.plural(doc.job_ranks or len(top), "rank"))]
        trows = [(r.rank, r.pod, r.node, value("x_ratio", r.data_wait_ratio), r.source,
                  "<- this pod" if r.pod == doc.pod else "") for r in top]
        out += ["  " + line for line in table(("rank", "pod", "node", "data-wait", "source", ""), trows)]
    stuck = doc.ranks_without_batches
    if stuck:
        out.append("  no batch in the window: %s" % ", ".join(
            "rank %s (%s on %s)" % (r.rank, r.pod, r.node) for r in stuck))

    loader = doc.loader.to_json() if doc.loader is not None else None
    if loader:
        keys = ("num_workers", "prefetch_factor", "batch_size", "pin_memory", "persistent_workers")
        text = ", ".join("%s=%s" % (k, loader.get(k)) for k in keys if k in loader)
        z = doc.sizing
        if z.workers_needed and "num_workers" in nextsteps.ruled_out(doc):
            # the top cause's prediction says more workers will not help (the queue's
            # arithmetic alone says they would): the report does not contradict itself
            text += "; more workers are not predicted to help (%s)" % doc.causes[0].cause
        elif z.workers_needed:
            text += "; workers needed to keep up: %s" % z.workers_needed
            if z.quota_limited:
                text += " (capped by the CPU quota)"
        out += ["", "Loader: " + text]

    deaths = doc.worker_deaths
    exits = doc.worker_exits
    if deaths or exits:
        out += ["", "Loader workers that died"]
        out += ["  %s (runbook: runbooks/StallscopeLoaderWorkerKilled.md)" % d["summary"]
                for d in deaths[-5:]]
    if exits:
        out += ["  In the window, pod %s (Prometheus): %s" % (doc.pod, ", ".join(
            "%d %s" % (n, reason) for reason, n in exits))]

    hang = doc.hang
    if hang:
        out += ["", "Hang (stacks the agent dumped once the rank was blocked %.0f s)"
                % hang.get("threshold_seconds", 0), "  " + hang["summary"]]
        out += ["  %-6s %-7d %-2s %-9s %s" % (p["role"], p["pid"], p.get("state") or "?",
                                               p.get("class") or "-", p.get("where") or p.get("error") or "")
                for p in hang.get("processes") or []]

    st = doc.stacks
    if st:
        out += ["", "Stacks (py-spy)"]
        if st.get("error"):
            out.append("  unavailable: %s" % st["error"])
        else:
            counts = ", ".join("%d %s" % (n, c) for c, n in st["workers"].items() if n)
            out.append("  main: %s; workers: %s" % (st["main"], counts or "none"))
            out.append("  " + st["reading"])
            for p in st["processes"]:
                if p.get("error"):
                    out.append("  %-6s %-7d %s" % (p["role"], p["pid"], p["error"]))
                else:
                    out.append("  %-6s %-7d %-9s %s"
                               % (p["role"], p["pid"], p["class"], p.get("where") or ""))

    if doc.next_steps:
        out += ["", "Next steps"]
        for step in doc.next_steps:
            out.append("  - %s%s" % (step.step, "  [%s]" % step.runbook if step.runbook else ""))
    if doc.commands:
        out += ["", "Deeper look"]
        out += ["  $ %s" % c for c in doc.commands]
    if doc.plot:
        out += ["", "Plot: %s" % doc.plot]
    used = ", ".join("%s %s%s" % (src.name, src.url, "" if src.ok else " (failed)")
                     for src in doc.sources)
    out += ["", "Sources: %s" % (used or "none")]
    return "\n".join(out) + "\n"


def render_json(doc: Report) -> str:
    """``diagnose --json``: the report's one encoder (document.encode)."""
    return json.dumps(document.encode(doc), indent=2, sort_keys=False, default=str) + "\n"
