"""The report as people read it: the verdict in one line, the evidence table, the
causes ranked, the slowest ranks, what to do next and the commands for a deeper look.
``--json`` prints the document itself (report.py)."""
import datetime
import json

from . import outlook, window

VERDICT_LINE = {
    "input_bound": "INPUT-BOUND",
    "not_input_bound": "NOT INPUT-BOUND (waits for another rank)",
    "healthy": "HEALTHY",
    "unknown": "UNKNOWN",
}


def value(signal, v, unit=None):
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


def table(headers, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    def line(r):
        return "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def _clock(ts):
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def _threshold(row):
    t = row.get("threshold")
    if t is None:
        return ""
    mark = {"above": ">", "below": "<", "equal": "="}.get(row.get("direction"), "")
    if row["signal"] in ("stall_period_steps", "workers_needed"):
        return "%snum_workers %s" % (mark, t)
    if row["signal"].endswith("_factor"):
        return "%s%gx median" % (mark, t)
    return "%s%s" % (mark, value(row["signal"], t))


def _status(row):
    s = row.get("status")
    return {"over": "OVER", "ok": "ok", "info": "-", "n/a": "-"}.get(s, s or "")


def headline(doc):
    who = "pod %s (ns %s): job %s, rank %s, node %s" % (
        doc["pod"], doc.get("namespace") or "?", doc.get("job") or "?", doc.get("rank"),
        doc.get("node") or "?")
    return "%s — %s" % (VERDICT_LINE.get(doc["verdict"], doc["verdict"]), who)


def render_text(doc):
    out = [headline(doc), doc.get("reason") or ""]
    since = doc.get("since")
    if since and since.get("above_threshold"):
        out.append("%s over the %s line since %s%s (%s)." % (
            "This rank has been" if since.get("rank") == doc.get("rank") else
            "The straggler (rank %s) has been" % since.get("rank"),
            value("x_ratio", doc["threshold"]), "before " if since["open_ended"] else "",
            _clock(since["since"]), window.human(since["for_seconds"])))
    for w in doc.get("warnings") or []:
        out.append("note: %s" % w)

    out += ["", "Evidence (window %s)" % window.human(doc["window_seconds"])]
    rows = []
    for r in doc.get("evidence") or []:
        name = r["signal"]
        if name == "data_wait_ratio" and r.get("rank") is not None:
            name = "data_wait_ratio (rank %s)" % r["rank"]
        if r.get("outside_stalls") is not None:
            name += " [outside stalls %s]" % value(r["signal"], r["outside_stalls"])
        rows.append((name, value(r["signal"], r["value"]), _threshold(r), _status(r), r.get("source", "")))
    out += ["  " + line for line in table(("signal", "value", "threshold", "status", "source"), rows)]
    if doc.get("job_scope") == "node":
        out.append("  (job max and median cover this node's ranks only: no cluster view)")

    causes = [c for c in doc.get("causes") or [] if c["score"] > 0]  # the JSON keeps them all
    if causes:
        out += ["", "Likely causes"]
        for i, c in enumerate(causes[:5], 1):
            out.append("  %d. %-21s %.2f  %s" % (i, c["cause"], c["score"], c.get("summary") or ""))

    told = outlook.lines(doc)
    if told:
        out += [""] + told

    top = doc.get("top_ranks") or []
    if top:
        out += ["", "Slowest ranks of job %s (%d ranks)" % (doc["job"], doc.get("job_ranks") or len(top))]
        rows = [(r["rank"], r["pod"], r["node"], value("x_ratio", r["data_wait_ratio"]),
                 r.get("source", ""), "<- this pod" if r["pod"] == doc["pod"] else "") for r in top]
        out += ["  " + line for line in table(("rank", "pod", "node", "data-wait", "source", ""), rows)]
    stuck = doc.get("ranks_without_batches") or []
    if stuck:
        out.append("  no batch in the window: %s" % ", ".join(
            "rank %s (%s on %s)" % (r["rank"], r["pod"], r["node"]) for r in stuck))

    loader = doc.get("loader")
    if loader:
        keys = ("num_workers", "prefetch_factor", "batch_size", "pin_memory", "persistent_workers")
        text = ", ".join("%s=%s" % (k, loader.get(k)) for k in keys if k in loader)
        z = doc.get("sizing") or {}
        if z.get("workers_needed"):
            text += "; workers needed to keep up: %s" % z["workers_needed"]
            if z.get("quota_limited"):
                text += " (capped by the CPU quota)"
        out += ["", "Loader: " + text]

    deaths = doc.get("worker_deaths") or []
    exits = doc.get("worker_exits") or []
    if deaths or exits:
        out += ["", "Loader workers that died"]
        out += ["  %s (runbook: runbooks/StallscopeLoaderWorkerKilled.md)" % d["summary"]
                for d in deaths[-5:]]
    if exits:
        out += ["  In the window, pod %s (Prometheus): %s" % (doc.get("pod"), ", ".join(
            "%d %s" % (e["count"], e["reason"]) for e in exits))]

    hang = doc.get("hang")
    if hang:
        out += ["", "Hang (stacks the agent dumped once the rank was blocked %.0f s)"
                % hang.get("threshold_seconds", 0), "  " + hang["summary"]]
        out += ["  %-6s %-7d %-2s %-9s %s" % (p["role"], p["pid"], p.get("state") or "?",
                                               p.get("class") or "-", p.get("where") or p.get("error") or "")
                for p in hang.get("processes") or []]

    st = doc.get("stacks")
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

    if doc.get("next_steps"):
        out += ["", "Next steps"]
        for s in doc["next_steps"]:
            out.append("  - %s%s" % (s["step"], "  [%s]" % s["runbook"] if s.get("runbook") else ""))
    if doc.get("commands"):
        out += ["", "Deeper look"]
        out += ["  $ %s" % c for c in doc["commands"]]
    if doc.get("plot"):
        out += ["", "Plot: %s" % doc["plot"]]
    used = ", ".join("%s %s%s" % (s["name"], s["url"], "" if s["ok"] else " (failed)")
                     for s in doc.get("sources") or [])
    out += ["", "Sources: %s" % (used or "none")]
    return "\n".join(out) + "\n"


def render_json(doc):
    return json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"
