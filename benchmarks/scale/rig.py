"""The scale rig: stallscope's series for N ranks (8 per node) on one Prometheus (path A,
`--path prometheus`) or on two vmagent members sharding the targets into
victoria-metrics with vmalert evaluating the generated rules (path B, `--path vm`).

One run per (size, path): start everything, wait until the recording rule covers every
rank, measure a steady minute (samples/s, memory of each server, rule-group evaluation
time), time every dashboard panel and rule expression, inject a straggler and time the
headline alert, run `stallscope diagnose` on the straggler's pod (and issue 36's `top`,
`report --job` and `diagnose --at` over a 7-day range), count the series, stop
everything. Each run appends one JSON line to --results; `--table` prints the table
(docs/deploy.md) from that file.

    make scale                                   # 2,048 and 8,192 ranks, both paths
    .venv/bin/python benchmarks/scale/rig.py --ranks 16384 --path vm
    .venv/bin/python benchmarks/scale/rig.py --table

Not in CI: a run takes 4-8 minutes and GiBs of memory at 16,384 ranks.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agents
import measure
import queries
import servers
import table

RESULTS = os.path.join(servers.ROOT, "benchmarks", "scale", "results.jsonl")


def run(ranks, path, for_duration, steady_s, keep):
    nodes = ranks // agents.RANKS_PER_NODE
    rundir = tempfile.mkdtemp(prefix="stallscope-scale-")
    rules = servers.rig_rules(rundir, for_duration)
    out = {"ranks": ranks, "nodes": nodes, "path": path, "for": for_duration,
           "scrape_interval_s": servers.SCRAPE_INTERVAL, "eval_interval_s": servers.EVAL_INTERVAL}
    procs = {}
    t0 = time.time()
    try:
        control = servers.start_agents(nodes, rundir, procs)
        start = servers.start_prometheus if path == "prometheus" else servers.start_victoriametrics
        names, url = start(nodes, rundir, rules, procs)
        started = {n: procs[n] for n in names}
        if not measure.wait_for(lambda: measure.ranks_recorded(url, ranks), 600, every=5):
            raise RuntimeError("the recording rule never covered all %d ranks" % ranks)
        out["ready_s"] = round(time.time() - t0, 1)
        print("ready after %.0fs" % out["ready_s"], flush=True)
        out.update(steady(path, url, started, steady_s))
        print("steady:", {k: out[k] for k in ("samples_per_s", "rss_bytes")}, flush=True)
        namespace, job = agents.NAMESPACE, agents.JOB
        out["panels"] = queries.time_panels(url, namespace, job, "node-%05d" % (nodes // 2))
        out["rules"] = queries.time_rules(url)
        print("queries: slowest panel %.2fs, slowest rule %.2fs; refused: %s" % (
            max(t or 0 for _, t, _ in out["panels"]), max(t or 0 for _, t, _ in out["rules"]),
            [(n, e) for n, t, e in out["panels"] + out["rules"] if t is None]), flush=True)
        node, rank = nodes // 2 + 1, (nodes // 2 + 1) * agents.RANKS_PER_NODE + 3
        limit = _seconds(for_duration) + 300
        out["alert"] = measure.straggler_to_alert(path, url, control, node, rank, limit)
        out["alert"].update(measure.alert_stages(url, out["alert"]["onset"], rank))
        print("alert:", out["alert"], flush=True)
        took, code, report = measure.diagnose(url, "%s-worker-%d" % (job, node), namespace)
        strag = report.get("straggler") or {}
        out["diagnose"] = {"wall_s": round(took, 2), "exit": code, "verdict": report.get("verdict"),
                           "named_rank": strag.get("rank"), "injected_rank": rank,
                           "top_cause": (report.get("causes") or [{}])[0].get("cause"),
                           "error": report.get("error")}
        print("diagnose:", out["diagnose"], flush=True)
        out["after_the_fact"] = measure.after_the_fact(url, "%s-worker-%d" % (job, node), namespace, job)
        print("after the fact:", out["after_the_fact"], flush=True)
        out.update(measure.series_counts(url, "node-%05d" % node))
        out["rss_bytes_end"] = {name: p.rss_bytes() for name, p in started.items()}
    finally:
        servers.stop_all(procs.values(), rundir, keep)
    out["wall_s"] = round(time.time() - t0, 1)
    return out


def steady(path, url, started, seconds):
    """Ingest rate, memory and rule-group evaluation time over ``seconds`` of steady state."""
    if path == "prometheus":
        counter = lambda: measure.server_metric(url, "prometheus_tsdb_head_samples_appended_total")  # noqa: E731
        active = lambda: measure.server_metric(url, "prometheus_tsdb_head_series")  # noqa: E731
    else:
        counter = lambda: measure.server_metric(url, "vm_rows_added_to_storage_total")  # noqa: E731
        active = lambda: measure.server_metric(url, "vm_cache_entries", 'type="storage/hour_metric_ids"')  # noqa: E731
    groups, rss = {}, {}
    c0, t0 = counter(), time.time()
    while time.time() - t0 < seconds:
        time.sleep(servers.EVAL_INTERVAL)
        now = measure.prometheus_groups(url) if path == "prometheus" else measure.vmalert_groups()
        for g, s in now.items():
            groups[g] = max(groups.get(g, 0.0), s)
        for name, p in started.items():
            rss[name] = max(rss.get(name) or 0, p.rss_bytes() or 0)
    c1, t1 = counter(), time.time()
    return {"samples_per_s": round((c1 - c0) / (t1 - t0)), "active_series": active(),
            "rule_group_eval_s": groups, "rss_bytes": rss}


def _seconds(d):
    return int(d[:-1]) * {"s": 1, "m": 60, "h": 3600}[d[-1]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--path", choices=["prometheus", "vm", "both"], default="both")
    ap.add_argument("--for", dest="for_duration", default="1m",
                    help="`for:` of every rule in the rig (the generated rules say 15m)")
    ap.add_argument("--interval", type=int, default=servers.SCRAPE_INTERVAL,
                    help="scrape and rule evaluation interval, seconds (15; large jobs often 30-60)")
    ap.add_argument("--steady", type=int, default=60, help="seconds of steady state measured")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the run directories (data, logs)")
    ap.add_argument("--table", action="store_true", help="print the table from --results and exit")
    a = ap.parse_args()
    # SIGTERM (and SIGINT, which background jobs ignore) unwind through run()'s finally,
    # which stops every server it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    servers.SCRAPE_INTERVAL = servers.EVAL_INTERVAL = a.interval
    if not a.table:
        for ranks in a.ranks:
            for path in (["prometheus", "vm"] if a.path == "both" else [a.path]):
                print("== %d ranks, %s" % (ranks, path), flush=True)
                out = run(ranks, path, a.for_duration, a.steady, a.keep)
                with open(a.results, "a") as f:
                    f.write(json.dumps(out) + "\n")
    with open(a.results) as f:
        print(table.render([json.loads(line) for line in f if line.strip()]))


if __name__ == "__main__":
    main()
