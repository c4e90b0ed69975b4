"""The rig's results as one Markdown table (docs/deploy.md): a column per (ranks, path),
the latest run of each."""

MIB = 1024 * 1024


def _mib(v):
    return "%.0f MiB" % (v / MIB) if v else "-"


def _s(v):
    return "-" if v is None else ("%.2f s" % v if v < 10 else "%.0f s" % v)


def rows(r):
    failed = [p for p in r.get("panels", []) + r.get("rules", []) if p[1] is None]
    panels = sorted((p for p in r.get("panels", []) if p[1] is not None), key=lambda p: -p[1])
    rules = sorted((p for p in r.get("rules", []) if p[1] is not None), key=lambda p: -p[1])
    alert, diag = r.get("alert") or {}, r.get("diagnose") or {}
    groups = r.get("rule_group_eval_s") or {}
    return [
        ("scrape / rule evaluation interval", "%s s / %s s" % (r.get("scrape_interval_s", 15),
                                                              r.get("eval_interval_s", 15))),
        ("series in storage (TSDB status)", "%.0f" % (r.get("series_total") or r.get("active_series") or 0)),
        ("series per rank, max / mean (budget 40)", "%.0f / %.1f" % (r.get("series_per_rank_max") or 0,
                                                                      r.get("series_per_rank_mean") or 0)),
        ("samples/s ingested", "%d" % r.get("samples_per_s", 0)),
        ("memory (RSS), per server", "<br>".join("%s %s" % (n, _mib(v)) for n, v in
                                                 sorted((r.get("rss_bytes") or {}).items()))),
        ("rule group evaluation, slowest", "<br>".join(
            "%s %s" % (g.replace("stallscope.", ""), _s(s))
            for g, s in sorted(groups.items(), key=lambda x: -x[1])[:2])),
        ("dashboard panels: count, slowest, median", "%d, %s (%s), %s" % (
            len(panels), _s(panels[0][1]) if panels else "-", panels[0][0] if panels else "",
            _s(panels[len(panels) // 2][1]) if panels else "-")),
        ("rule expressions: count, slowest", "%d, %s (%s)" % (len(rules), _s(rules[0][1]) if rules else "-",
                                                              rules[0][0] if rules else "")),
        ("queries the server refused", ", ".join(p[0] for p in failed) or "none"),
        ("straggler to headline alert: pending / firing (for: %s)" % r.get("for"),
         "%s / %s" % (_s(alert.get("pending_s")), _s(alert.get("firing_s")))),
        ("... of which: 5m ratio over the line (raw / recorded)",
         "%s / %s" % (_s(alert.get("raw_over_line_s")), _s(alert.get("record_over_line_s")))),
        ("`stallscope diagnose` wall time; straggler named",
         "%s; %s" % (_s(diag.get("wall_s")), "rank %s" % diag.get("named_rank")
                     if diag.get("named_rank") == diag.get("injected_rank") else "NO: %s" % diag)),
        ("`top` / `report --job` / `diagnose --at` over 7 days: wall time", " / ".join(
            _s((r.get("after_the_fact") or {}).get(k, {}).get("wall_s"))
            for k in ("top", "report", "diagnose_at"))),
    ]


def render(results):
    latest = {}
    for r in results:
        latest[(r["ranks"], r["path"])] = r
    keys = sorted(latest)
    head = ["measured"] + ["%d ranks, %s" % (n, "1 Prometheus" if p == "prometheus" else "vmagent x2 + VM")
                           for n, p in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    table = [rows(latest[k]) for k in keys]
    for i, (label, _) in enumerate(table[0] if table else []):
        lines.append("| " + " | ".join([label] + [t[i][1] for t in table]) + " |")
    return "\n".join(lines)
