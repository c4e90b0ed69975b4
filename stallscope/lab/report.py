"""What the lab prints: a progress line per second while the job runs, then the result
(per-rank data-wait, expected vs found, alerts) and the ``stallscope diagnose`` report."""
import sys
import textwrap


def _pct(x):
    return "  n/a" if x is None else "%4.0f%%" % (100 * x)


def _ratios(base, now):
    out = {}
    for rank, n in sorted(now.items()):
        b = base.get(rank) or {}
        steps = n["step_seconds_total"] - b.get("step_seconds_total", 0)
        wait = n["data_wait_seconds_total"] - b.get("data_wait_seconds_total", 0)
        out[rank] = (n["batches"] - b.get("batches", 0), wait / steps if steps > 0 else None)
    return out


class Progress:
    """One line per tick: elapsed time, and per rank the batches and the share of step
    time spent waiting for data, measured by the agent since the window started. On a
    terminal the line is redrawn in place; elsewhere one line every 5 s."""

    WIDTH = 20

    def __init__(self, say, duration, target, live=None, stream=None):
        self.say, self.duration, self.target = say, duration, target
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.last_print = -1e9
        self.line = ""

    def render(self, elapsed, base, now):
        done = min(1.0, elapsed / self.duration) if self.duration else 1.0
        bar = "#" * int(done * self.WIDTH) + "." * (self.WIDTH - int(done * self.WIDTH))
        ranks = "  ".join("r%d %4d batches wait%s" % (rank, n, _pct(ratio))
                          for rank, (n, ratio) in _ratios(base, now).items())
        return "[%s] %3.0f/%.0fs  %s" % (bar, min(elapsed, self.duration), self.duration, ranks)

    def update(self, elapsed, base, now):
        self.line = self.render(elapsed, base, now)
        if self.live:
            self.stream.write("\r\x1b[2K" + self.line)
            self.stream.flush()
        elif elapsed - self.last_print >= 5 or elapsed >= self.duration:
            self.last_print = elapsed
            self.say(self.line)

    def done(self):
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


_SOURCE = {"prometheus": "Prometheus, the lab's rules",
           "sli": "from the SLI with the lab's windows: no Prometheus"}


def _cause(c):
    return c or "none"


def _rank(r):
    return "-" if r is None else str(r)


def render(result):
    lines = ["", "stallscope lab: %s" % result["scenario"], "  %s" % result["title"]]
    if result.get("simulated_gpu"):
        lines.append("  GPU: SIMULATED (no GPU is read; busy while the loop computes)")
    lines.append("")
    # the node column where the ranks ran on lab nodes (lab/nodes.py)
    placed = len({r.get("node") for r in result["ranks"]}) > 1
    lines.append("  rank  pod           %s batches  data-wait  share of step time" % (
        " node      " if placed else ""))
    for r in result["ranks"]:
        lines.append("  %4d  %-13s %s %7d  %8.2fs  %s%s" % (
            r["rank"], r["pod"], " %-10s" % (r.get("node") or "-") if placed else "",
            r["batches"], r.get("data_wait_seconds") or 0.0,
            _pct(r["data_wait_ratio"]), "   <- fault injected here" if (
                result["expected"]["rank"] == r["rank"]) else ""))
    exp, found = result["expected"], result["found"]
    lines += ["", "  expected: cause %-22s rank %s" % (_cause(exp["cause"]), _rank(exp["rank"])),
              "  found:    cause %-22s rank %s   (%s)" % (_cause(found["cause"]), _rank(found["rank"]),
                                                         found["source"])]
    alerts = result.get("alerts")
    if alerts is None:
        lines.append("  alerts:   not checked (no Prometheus: not installed, or --no-prometheus)")
    else:
        lines.append("  alerts:   fired %s; expected %s -> %s" % (
            ", ".join(alerts["fired"]) or "none", ", ".join(alerts["expected"]) or "none",
            "match" if alerts["matched"] else "MISMATCH"))
    agree = result.get("agreement")
    if agree:
        lines.append("  alert vs diagnose: %s %s (%s); diagnose: %s -> %s" % (
            "StallscopeDataWaitHigh", agree["alert"], _SOURCE.get(agree["source"], agree["source"]),
            ", ".join("rank " + v.replace(":", " ") for v in agree["verdicts"]) or "no rank",
            agree["state"].upper() if agree["state"] == "disagree" else agree["state"]))
        if agree["state"] != "agree":
            lines += textwrap.wrap(agree["why"], 88, initial_indent="    ", subsequent_indent="    ")
    setup = result.get("setup")
    if setup:
        warned = (setup["end"].get(str(setup["target"])) or {}).get("warned") or []
        lines.append("  set-up:   rank %s warned %s at the first batch (%.1fs after it) and by the end; "
                     "expected %s -> %s" % (
                         setup["target"], ", ".join(warned) or "nothing", setup["first_batch"]["after_s"],
                         ", ".join(setup["expected"]) or "nothing",
                         "match" if setup["matched"] else "MISMATCH"))
        for p in setup["problems"]:
            lines.append("    " + p)
    if result.get("beside"):  # a second job on the same lab nodes (issue 35)
        b = result["beside"]
        lines.append("  beside:   job %s: %s (through the agents / Prometheus alone); expected %s -> %s" % (
            b["job"], ", ".join("%s %s" % (pod, "/".join(v)) for pod, v in sorted(b["verdicts"].items())),
            b["expected_verdict"], "match" if b["matched"] else "MISMATCH"))
    lines.append("  result:   %s" % ("OK" if result["ok"] else "NOT OK"))
    for h in (alerts or {}).get("headline") or []:
        since = (h.get("active_at") or "")[11:19]
        lines += ["", "  Prometheus: %s is FIRING (since %s UTC)" % (h["alert"], since)]
        lines += textwrap.wrap(h["summary"] + " " + h["description"], 88, initial_indent="    ",
                               subsequent_indent="    ")
    if result.get("recorded"):
        lines.append("  trace:    %s" % result["recorded"])
    if result.get("report"):
        lines += ["", result["report"].rstrip()]
    return "\n".join(lines) + "\n"


def keeping(lab, result):
    print(render(result), flush=True)
    agents = "".join("  agent       %s/metrics  %s/api/v1/ranks\n" % (a.url, a.url) for a in lab.agents())
    print("Kept running until Ctrl-C:\n%s%s  work dir    %s" % (
        agents, "  prometheus  %s\n" % lab.prom.url if lab.prom else "", lab.session.workdir), flush=True)
