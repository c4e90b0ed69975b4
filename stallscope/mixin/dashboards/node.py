"""Node and pod drill-down: the node-side and loader-side signals behind a waiting rank.

Pod-level series (cfs, psi, shm, fuse) carry job, pod, namespace and node but no rank;
node-wide readings carry only node (pod="").
"""
from grafana_foundation_sdk.models import dashboard as dm

from ... import vocabulary
from .. import promql
from .panels import BATCHES_PER_SECOND, CORES, RATE, VARS_NODE, VARS_POD, VARS_RANK, Board, q, ts

UID = "node"
# The kernel's default congestion_threshold, the correlator's line on the signal.
FUSE_WAITING = vocabulary.line_of("fuse_unhealthy", "fuse_waiting_requests").threshold


def _rate_sum(cfg, metric, by, matchers):
    return "sum by (%s) (%s)" % (by, promql.rate(cfg, metric, matchers, RATE))


def build(cfg):
    n = promql.names(cfg)
    b = Board(cfg, UID, "stallscope / Node and pod drill-down",
              "The signals behind a waiting rank: CPU quota, pressure, /dev/shm, FUSE, loader "
              "workers, storage and the agent's own health.")
    b.link("Job overview", "overview")
    rank_legend = "{{job}} rank {{rank}} ({{pod}})"
    pod_legend = "{{namespace}}/{{pod}}"

    b.row("Ranks")
    b.add(
        ts("Data-wait per rank", "Share of step time each selected rank spent blocked in "
           "next(loader) (the SLI, %s)." % n["rank_ratio"],
           [q(promql.sel(cfg, n["rank_ratio"], *VARS_RANK), rank_legend)], "percentunit", min_val=0,
           warn=cfg.data_wait_warning, crit=cfg.data_wait_page),
        ts("Batches per second per rank", "Pace of each rank's loop. A rank at 0 while it still "
           "reports is blocked in next(): a dead mount or a hung worker.",
           [q(promql.sel(cfg, n["rank_steps"], *VARS_RANK), rank_legend)], BATCHES_PER_SECOND, min_val=0),
    )

    b.row("CPU quota (CFS)")
    by_c = "namespace, pod, container"
    b.add(
        ts("Throttled periods", "Share of CFS periods in which the cgroup hit its CPU quota, per "
           "container. Throttling alone is common and harmless; it matters when it lines up with "
           "a rank's data-wait (StallscopeCPUThrottled above %s)."
           % promql.pct(cfg.line("StallscopeCPUThrottled")),
           [q(promql.signal(cfg, "cfs_throttled_ratio", VARS_POD, RATE), "{{pod}}/{{container}}")],
           "percentunit", min_val=0, warn=cfg.line("StallscopeCPUThrottled")),
        ts("Throttled time", "Seconds per second the cgroup's threads spent throttled: 0.5 means "
           "the workers lose half a CPU's worth of time to the quota.",
           [q(_rate_sum(cfg, "stallscope_cpu_cfs_throttled_seconds_total", by_c, VARS_POD),
              "{{pod}}/{{container}}")], "s", min_val=0),
        ts("CPU quota and oversubscription", "Effective CFS quota in cores; the flag is 1 when the "
           "cgroup runs more loader processes than its quota has cores (PyTorch sizes workers from "
           "CPU affinity, not the quota: more workers will not help, raise the limit).",
           [q(promql.sel(cfg, "stallscope_cpu_cfs_quota_cores", *VARS_POD), "quota {{pod}}/{{container}}"),
            q(promql.sel(cfg, "stallscope_cpu_cfs_quota_oversubscribed", *VARS_POD),
              "oversubscribed {{pod}}/{{container}}")], "short", w=24, min_val=0),
    )

    b.row("Pressure (PSI)")
    b.add(
        ts("Pressure per pod", "PSI \"some\" of the pod's cgroup: share of time in which at least "
           "one task waited for CPU, I/O or memory. I/O pressure on a waiting rank points at "
           "storage; memory pressure at reclaim or thrashing.",
           [q(promql.signal(cfg, "psi_%s_some_ratio" % r, VARS_POD, RATE), "%s {{pod}}" % r)
            for r in ("cpu", "io", "memory")],
           "percentunit", min_val=0),
        ts("Pressure on the node", "PSI \"some\" of the whole node (/proc/pressure): contention "
           "from other pods shows here before it shows in a pod's own cgroup.",
           [q("sum by (node) (%s)" % promql.rate(cfg, "stallscope_pressure_%s_waiting_seconds_total" % r,
                                                 ('pod=""',) + VARS_NODE, RATE), "%s {{node}}" % r)
            for r in ("cpu", "io", "memory")], "percentunit", min_val=0),
    )

    b.row("/dev/shm and loader workers")
    b.add(
        ts("/dev/shm used", "Share of /dev/shm in use, per pod and for the node. Workers hand "
           "every batch to the loop through it; when full they die with a bus error or ENOSPC.",
           [q(promql.signal(cfg, "shm_used_ratio", VARS_POD), pod_legend),
            q("max by (node) (%s / %s)" % (
                promql.sel(cfg, "stallscope_shm_used_bytes", 'pod=""', *VARS_NODE),
                promql.sel(cfg, "stallscope_shm_size_bytes", 'pod=""', *VARS_NODE)), "node {{node}}")],
           "percentunit", min_val=0, max_val=1, warn=cfg.line("StallscopeShmNearlyFull")),
        ts("Loader worker CPU against the quota", "CPU cores used by all loader workers of "
           "each rank, and the pod's CFS quota in cores. Workers at the quota are throttled: "
           "more workers will not help, a higher limit or cheaper per-sample work will.",
           [q("sum by (namespace, job, rank, pod) (%s)" % promql.rate(
               cfg, "stallscope_loader_workers_cpu_seconds_total", VARS_RANK, RATE), rank_legend),
            q("max by (namespace, pod) (%s)" % promql.sel(cfg, "stallscope_cpu_cfs_quota_cores", *VARS_POD),
              "quota {{pod}}")], CORES, min_val=0),
        ts("Largest loader worker's memory (RSS)", "Resident memory of each rank's largest "
           "loader worker. Steady growth is copy-on-access of Python objects in the dataset "
           "(refcounts touch forked pages: pytorch/pytorch#13246).",
           [q(promql.sel(cfg, "stallscope_loader_worker_max_resident_memory_bytes", *VARS_RANK),
              rank_legend)],
           "bytes", min_val=0),
        ts("Loader workers alive and blocked", "Workers alive per rank (a drop: workers died, "
           "e.g. a bus error from a full /dev/shm or the OOM killer) and workers in D state "
           "(blocked in the kernel, typically on a hung FUSE mount or NFS).",
           [q(promql.sel(cfg, "stallscope_loader_workers_alive", *VARS_RANK), "alive " + rank_legend),
            q(promql.sel(cfg, "stallscope_loader_workers_dstate", *VARS_RANK), "D state " + rank_legend)],
           "short", w=24, min_val=0),
    )

    b.row("Loader: batch production against compute")
    by_r = "namespace, job, rank"
    b.add(
        ts("Batch load time vs compute", "T_l: time one worker takes to produce a batch. T_c: "
           "the loop's compute per step (step time minus data-wait). With W workers the loop "
           "never waits while T_l / W <= T_c.",
           [q("sum by (%s) (%s)\n/\nsum by (%s) (%s)" % (
               by_r, promql.rate(cfg, "stallscope_batch_load_seconds_sum", VARS_RANK, RATE),
               by_r, promql.rate(cfg, "stallscope_batch_load_seconds_count", VARS_RANK, RATE)),
               "T_l {{job}} rank {{rank}}"),
            q("(sum by (%s) (%s) - sum by (%s) (%s))\n/\nsum by (%s) (%s)" % (
                by_r, promql.rate(cfg, "stallscope_step_seconds_sum", VARS_RANK, RATE),
                by_r, promql.rate(cfg, "stallscope_data_wait_seconds_sum", VARS_RANK, RATE),
                by_r, promql.rate(cfg, "stallscope_step_seconds_count", VARS_RANK, RATE)),
              "T_c {{job}} rank {{rank}}")], "s", min_val=0),
        ts("Loader workers needed", "Workers that would keep up (T_l / T_c, capped by the pod's "
           "CPU quota), next to the configured num_workers in the legend.",
           [q("%s\n* on (namespace, job, rank) group_left (num_workers)\n"
              "group by (namespace, job, rank, num_workers) (%s)" % (
               promql.sel(cfg, "stallscope_loader_workers_needed", *VARS_RANK),
               promql.sel(cfg, "stallscope_loader_info", *VARS_RANK)),
              "{{job}} rank {{rank}} (has {{num_workers}})")], "short", min_val=0),
    )

    b.row("Storage: shard reads, cache, FUSE")
    b.add(
        ts("Shard read latency", "p50, p95 and p99 of one shard read per storage tier. A p99 far "
           "above p50 with data-wait rising: a slow backend or a congested mount.",
           [q(promql.shard_read_quantile(cfg, x, VARS_POD, RATE), "p%s {{pod}} {{tier}}" % int(x * 100))
            for x in (0.5, 0.95, 0.99)], "s", min_val=0, warn=cfg.line("StallscopeShardReadSlow")),
        ts("Cache miss rate", "Share of cache lookups that missed, per tier. A cold or evicted "
           "cache sends reads to the slow tier: prewarm it or size it for the working set "
           "(StallscopeCacheHitRateLow above %s)." % promql.pct(cfg.line("StallscopeCacheHitRateLow")),
           [q(promql.signal(cfg, "cache_miss_ratio", VARS_POD, RATE), "{{pod}} {{tier}}")],
           "percentunit", min_val=0, max_val=1, warn=cfg.line("StallscopeCacheHitRateLow")),
        ts("FUSE mounts: up and probe latency", "1 = the mount answers a stat; 0 = dead "
           "(ENOTCONN) or stuck. Probe latency (in seconds) is how long the last stat took (a "
           "stuck one grows until it returns).",
           [q(promql.signal(cfg, "fuse_up", VARS_POD), "up {{mountpoint}} ({{pod}})"),
            q(promql.signal(cfg, "fuse_probe_seconds", VARS_POD), "probe {{mountpoint}} ({{pod}})")],
           "short", min_val=0).override_by_query("B", [dm.DynamicConfigValue(id_val="unit", value="s")]),
        ts("FUSE requests waiting", "Requests queued on the FUSE connection (fusectl 'waiting'). "
           "Above the congestion threshold (%s by default) the kernel throttles readers."
           % promql.num(FUSE_WAITING),
           [q(promql.signal(cfg, "fuse_waiting_requests", VARS_POD), "{{mountpoint}} ({{pod}})")],
           "short", min_val=0, warn=FUSE_WAITING),
    )

    b.row("Agent and exporters")
    node_of = "* on (instance) group_left (node)\n%s" % promql.sel(
        cfg, "stallscope_agent_build_info", *VARS_NODE)
    b.add(
        ts("Exporter success", "1 when the exporter's last collection succeeded within its "
           "deadline. A 0 that stays: its signal is missing from dashboards, alerts and diagnose.",
           [q("%s\n%s" % (promql.sel(cfg, "stallscope_exporter_success"), node_of), "{{node}} {{exporter}}")],
           "short", min_val=0, max_val=1),
        ts("Exporter duration", "Wall time of each exporter's last collection. One that grows to "
           "its deadline is hanging (e.g. a stat on a stuck FUSE mount).",
           [q("%s\n%s" % (promql.sel(cfg, "stallscope_exporter_duration_seconds"), node_of),
              "{{node}} {{exporter}}")], "s", min_val=0),
    )
    return b.model()
