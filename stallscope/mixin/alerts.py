"""Alert rules, in the monitoring-mixin style: `Stallscope` prefix, a `severity` label,
a one-sentence `summary`, a templated `description` naming job, rank, pod and node, and a
`runbook_url` (added by rules.py from the config). Prometheus 2.42 features only.

Every alert also carries a ``probe``: its expression without the threshold (and, for the
cause alerts, joined to every rank rather than only the waiting ones). The real-Prometheus
tests require each probe to return data, which proves the metrics exist and the label
joins match; the threshold itself is proven by the promtool unit tests.
"""
import dataclasses

from . import promql
from .promql import indent, num, pct

CAUSE_JOIN = "* on (namespace, pod) group_left (job, node)"


@dataclasses.dataclass(frozen=True)
class Alert:
    name: str
    group: str
    severity: str
    for_: str
    expr: str
    probe: str
    summary: str
    description: str
    metrics: tuple  # the exported metrics it reads (to tell which part must land first)


# -- template snippets (Go text/template, expanded by Prometheus at alert time) ----------
def _query(expr_fmt, *args):
    """``printf "<expr_fmt>" <args> | query``: PromQL strings take Go's %q quoting."""
    return 'printf "%s" %s | query' % (expr_fmt.replace('"', '\\"'), " ".join(args))


def _worst_rank(cfg):
    q = _query("topk(1, %s{namespace=%%q, job=%%q})" % promql.names(cfg)["rank_ratio"],
               "$labels.namespace", "$labels.job")
    return ("{{ with %s }}{{ with first . }}the slowest is rank {{ label \"rank\" . }} "
            "(pod {{ label \"pod\" . }} on node {{ label \"node\" . }}); run "
            "`stallscope diagnose {{ label \"pod\" . }} -n {{ $labels.namespace }}`"
            "{{ end }}{{ end }}" % q)


def _ranks_of_pod(cfg):
    """The pod's ranks that make the cause matter: 'rank 3 waits 12%' or, for a rank
    blocked for good (value 0 from the steps series), 'rank 3 made no progress'."""
    n = promql.names(cfg)
    q = _query("sort_desc(%s{namespace=%%q, pod=%%q} >= %s) or %s{namespace=%%q, pod=%%q} == 0" % (
        n["rank_ratio"], num(cfg.cause_min_wait_ratio), n["rank_steps"]),
        "$labels.namespace", "$labels.pod", "$labels.namespace", "$labels.pod")
    return ("{{ range $i, $r := %s }}{{ if $i }}, {{ end }}rank {{ $r.Labels.rank }} "
            "{{ if $r.Value }}waits {{ $r.Value | humanizePercentage }}{{ else }}made no progress in %s"
            "{{ end }}{{ end }}" % (q, cfg.rate_window))


def _pod_where(cfg):
    return ("pod {{ $labels.namespace }}/{{ $labels.pod }} (job {{ $labels.job }}, node "
            "{{ $labels.node }})")


# -- joins ---------------------------------------------------------------------------------
def _pods_of(ranks):
    # One series per pod (a pod runs one job on one node); topk keeps the join one-to-one
    # even while a recreated pod briefly has series from two nodes.
    return "topk by (namespace, pod) (1, group by (namespace, pod, job, node) (\n%s\n))" % indent(ranks)


def _cause(cfg, name, signal, cmp, metrics, summary, description):
    n = promql.names(cfg)
    # `signal` uses only operators that bind tighter than the comparison (/, *, calls).
    expr = "(\n%s\n  %s\n)\n%s\n%s" % (indent(signal), cmp, CAUSE_JOIN, _pods_of(promql.waiting_pods(cfg)))
    probe = "(\n%s\n)\n%s\n%s" % (indent(signal), CAUSE_JOIN, _pods_of(n["rank_ratio"]))
    return Alert(name, "stallscope.causes", "warning", cfg.cause_for, expr, probe, summary,
                 description + " Waiting ranks in the pod: " + _ranks_of_pod(cfg) + ".", metrics)


# -- the alerts ----------------------------------------------------------------------------
def _headline(cfg, name, severity, threshold):
    n = promql.names(cfg)
    return Alert(
        name, "stallscope.slo", severity, cfg.data_wait_for,
        "%s > %s" % (n["job_max"], num(threshold)), n["job_max"],
        "Training job {{ $labels.namespace }}/{{ $labels.job }} is waiting on its input pipeline.",
        "The slowest rank of job {{ $labels.job }} spent {{ $value | humanizePercentage }} of its "
        "step time blocked in next(loader) over the last %s (threshold %s); in synchronous "
        "training every rank runs at its pace: %s." % (
            cfg.rate_window, pct(threshold), _worst_rank(cfg)),
        ("stallscope_data_wait_seconds", "stallscope_step_seconds"))


def _straggler(cfg):
    n = promql.names(cfg)
    expr = ("%s\n> on (namespace, job) group_left ()\n(%s * %s)\nand\n%s > %s" % (
        n["rank_ratio"], num(cfg.straggler_factor), n["job_median"], n["rank_ratio"],
        num(cfg.straggler_min_ratio)))
    probe = "%s\n* on (namespace, job) group_left ()\n(%s >= 0)" % (n["rank_ratio"], n["job_median"])
    median = _query("%s{namespace=%%q, job=%%q}" % n["job_median"], "$labels.namespace", "$labels.job")
    return Alert(
        "StallscopeStragglerRank", "stallscope.slo", "warning", cfg.straggler_for, expr, probe,
        "Rank {{ $labels.rank }} of job {{ $labels.namespace }}/{{ $labels.job }} waits for data "
        "far longer than the job's other ranks.",
        "Rank {{ $labels.rank }} (pod {{ $labels.pod }} on node {{ $labels.node }}) spent "
        "{{ $value | humanizePercentage }} of its step time waiting for data over the last %s, "
        "more than %s times the job's median ({{ with %s }}{{ . | first | value | humanizePercentage }}"
        "{{ end }}): the cause is local to that pod or node." % (
            cfg.rate_window, num(cfg.straggler_factor), median),
        ("stallscope_data_wait_seconds", "stallscope_step_seconds"))


def _no_progress(cfg):
    # A rank blocked in next() for good reports no wait at all (the hook records a wait
    # when next() returns), so a hung job never crosses the data-wait line: say so here.
    n = promql.names(cfg)
    expr = "max by (namespace, job) (%s) == 0" % n["rank_steps"]
    return Alert(
        "StallscopeJobNoProgress", "stallscope.slo", "critical", cfg.data_wait_for, expr,
        "max by (namespace, job) (%s)" % n["rank_steps"],
        "Training job {{ $labels.namespace }}/{{ $labels.job }} makes no progress.",
        "No rank of job {{ $labels.job }} received a batch in the last %s, while their hooks "
        "still report: the job hangs (a dead or stuck mount under a loader, a worker blocked in "
        "the kernel, a collective waiting for a rank that never comes)." % cfg.rate_window,
        ("stallscope_step_seconds",))


def _causes(cfg):
    w = cfg.rate_window
    return [
        _cause(cfg, "StallscopeCPUThrottled", promql.cfs_throttled_ratio(cfg),
               "> %s" % num(cfg.cfs_throttled_ratio), ("stallscope_cpu_cfs_periods_total",
                                                       "stallscope_cpu_cfs_throttled_periods_total"),
               "The CFS quota throttles a waiting rank's loader.",
               "Container {{ $labels.container }} of %s was throttled in {{ $value | humanizePercentage }} "
               "of its CFS periods over the last %s (threshold %s)." % (
                   _pod_where(cfg), w, pct(cfg.cfs_throttled_ratio))),
        _cause(cfg, "StallscopeIOPressure", promql.pressure_ratio(cfg, "io"),
               "> %s" % num(cfg.io_pressure_ratio), ("stallscope_pressure_io_waiting_seconds_total",),
               "I/O pressure stalls a waiting rank's pod.",
               "Tasks of %s were stalled on I/O {{ $value | humanizePercentage }} of the time over "
               "the last %s (PSI io some; threshold %s)." % (_pod_where(cfg), w, pct(cfg.io_pressure_ratio))),
        _cause(cfg, "StallscopeMemoryPressure", promql.pressure_ratio(cfg, "memory"),
               "> %s" % num(cfg.memory_pressure_ratio), ("stallscope_pressure_memory_waiting_seconds_total",),
               "Memory pressure stalls a waiting rank's pod.",
               "Tasks of %s were stalled on memory (reclaim, swap-in, thrashing) {{ $value | "
               "humanizePercentage }} of the time over the last %s (PSI memory some; threshold %s)." % (
                   _pod_where(cfg), w, pct(cfg.memory_pressure_ratio))),
        _cause(cfg, "StallscopeShmNearlyFull", promql.shm_used_ratio(cfg),
               "> %s" % num(cfg.shm_used_ratio), ("stallscope_shm_used_bytes", "stallscope_shm_size_bytes"),
               "/dev/shm of a waiting rank's pod is nearly full.",
               "/dev/shm of %s is {{ $value | humanizePercentage }} full (threshold %s); DataLoader "
               "workers pass every batch through it and die with a bus error when it fills." % (
                   _pod_where(cfg), pct(cfg.shm_used_ratio))),
        _cause(cfg, "StallscopeFuseMountDown", promql.fuse_up(cfg), "== 0", ("stallscope_fuse_up",),
               "A FUSE mount that a waiting rank reads from is down.",
               "FUSE mount {{ $labels.mountpoint }} ({{ $labels.fstype }}) of %s does not answer: "
               "its daemon is dead or the connection was aborted (ENOTCONN)." % _pod_where(cfg)),
        _cause(cfg, "StallscopeFuseMountStuck", promql.fuse_probe(cfg),
               "> %s" % num(cfg.fuse_probe_seconds), ("stallscope_fuse_probe_seconds",),
               "A FUSE mount that a waiting rank reads from is stuck.",
               "A stat of FUSE mount {{ $labels.mountpoint }} ({{ $labels.fstype }}) of %s took "
               "{{ $value | humanizeDuration }} (threshold %ss): the daemon is hung or its backend "
               "is far too slow." % (_pod_where(cfg), num(cfg.fuse_probe_seconds))),
        _cause(cfg, "StallscopeShardReadSlow", promql.shard_read_quantile(cfg, 0.99),
               "> %s" % num(cfg.shard_read_p99_seconds), ("stallscope_shard_read_seconds",),
               "Shard reads of a waiting rank are slow.",
               "The p99 latency of shard reads from tier {{ $labels.tier }} in %s was {{ $value | "
               "humanizeDuration }} over the last %s (threshold %ss)." % (
                   _pod_where(cfg), w, num(cfg.shard_read_p99_seconds))),
        _cause(cfg, "StallscopeCacheHitRateLow", promql.cache_hit_ratio(cfg),
               "< %s" % num(cfg.cache_hit_ratio), ("stallscope_cache_requests_total",),
               "The data cache of a waiting rank mostly misses.",
               "Only {{ $value | humanizePercentage }} of cache lookups in tier {{ $labels.tier }} of %s "
               "hit over the last %s (threshold %s); misses go to the slower tier." % (
                   _pod_where(cfg), w, pct(cfg.cache_hit_ratio))),
    ]


def _health(cfg):
    up = promql.sel(cfg, "up", cfg.agent_selector) if cfg.agent_selector else "up"
    step_count = promql.sel(cfg, "stallscope_step_seconds_count")
    silent = ("group by (%s) (present_over_time(%s[%s]))\nunless on (namespace, job, rank)\n%s\n"
              "and on (namespace, job)\n%s" % (promql.BY_RANK, step_count, cfg.silent_lookback,
                                              step_count, step_count))
    silent_probe = ("group by (%s) (present_over_time(%s[%s]))\nand on (namespace, job)\n%s" % (
        promql.BY_RANK, step_count, cfg.silent_lookback, step_count))
    success = promql.sel(cfg, "stallscope_exporter_success")
    dropped = "sum by (%s) (%s)" % (promql.BY_RANK, promql.rate(cfg, "stallscope_hook_dropped_events_total"))
    return [
        Alert("StallscopeAgentDown", "stallscope.health", "warning", cfg.health_for,
              "%s == 0" % up, up,
              "A stallscope agent is down.",
              "Prometheus has not scraped the stallscope agent at {{ $labels.instance }} for %s: data-wait "
              "and node signals of the ranks on that node are missing." % cfg.health_for,
              ("up",)),
        Alert("StallscopeRankSilent", "stallscope.health", "warning", cfg.health_for, silent, silent_probe,
              "Rank {{ $labels.rank }} of job {{ $labels.namespace }}/{{ $labels.job }} stopped reporting.",
              "The hook of rank {{ $labels.rank }} (pod {{ $labels.pod }} on node {{ $labels.node }}) "
              "reported within the last %s but not now, while other ranks of job {{ $labels.job }} still "
              "report: the process died or hangs, or it lost the agent's socket." % cfg.silent_lookback,
              ("stallscope_step_seconds",)),
        Alert("StallscopeExporterFailing", "stallscope.health", "warning", cfg.health_for,
              "%s == 0" % success, success,
              "A stallscope exporter keeps failing.",
              "Exporter {{ $labels.exporter }} of the agent at {{ $labels.instance }} has failed every "
              "collection for %s: the signal it reads is missing from dashboards, alerts and diagnose." % (
                  cfg.health_for),
              ("stallscope_exporter_success",)),
        Alert("StallscopeHookDroppingEvents", "stallscope.health", "warning", cfg.health_for,
              "%s > 0" % dropped, dropped,
              "The hook of rank {{ $labels.rank }} of job {{ $labels.namespace }}/{{ $labels.job }} drops events.",
              "The hook of rank {{ $labels.rank }} (pod {{ $labels.pod }} on node {{ $labels.node }}) could "
              "not deliver {{ printf \"%%.2f\" $value }} batch events per second to the agent over the last %s: "
              "its data-wait figures undercount." % cfg.rate_window,
              ("stallscope_hook_dropped_events_total",)),
    ]



def all_alerts(cfg):
    return ([_headline(cfg, "StallscopeDataWaitHigh", "warning", cfg.data_wait_warning),
             _headline(cfg, "StallscopeDataWaitCritical", "critical", cfg.data_wait_critical),
             _straggler(cfg), _no_progress(cfg)]
            + _causes(cfg) + _health(cfg))
