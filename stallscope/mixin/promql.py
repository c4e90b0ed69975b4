"""PromQL building blocks shared by the recording rules, the alerts and the dashboards.

Each signal is written once here, as a function of the config and of extra label
matchers (the dashboards pass their template variables, the rules pass none), so a
panel and the alert about the same thing can never drift apart.

Labels: per-rank series carry job, rank, pod, namespace and node (DESIGN.md). The SLI
rules aggregate onto exactly those five, dropping whatever the scrape adds (instance,
a PodMonitor's container/endpoint), so every join below can name its labels.
"""
RANK = ("namespace", "job", "rank", "pod", "node")
BY_RANK = "namespace, job, rank, pod, node"
BY_POD = "namespace, pod"


def sel(cfg, metric, *matchers):
    body = cfg.sel(*matchers)
    return "%s{%s}" % (metric, body) if body else metric


def rate(cfg, metric, matchers=(), window=None):
    return "rate(%s[%s])" % (sel(cfg, metric, *matchers), window or cfg.rate_window)


# -- the SLI and its recorded names ----------------------------------------------------
def names(cfg):
    """Recorded series names; the window is part of the name (level:metric:operations)."""
    w = cfg.rate_window
    return {
        "rank_ratio": "rank:stallscope_data_wait_ratio:rate%s" % w,
        "rank_steps": "rank:stallscope_steps:rate%s" % w,
        "job_max": "job:stallscope_data_wait_ratio:max_rate%s" % w,
        "job_median": "job:stallscope_data_wait_ratio:median_rate%s" % w,
    }


def data_wait_ratio(cfg, matchers=(), window=None):
    """Per rank: seconds blocked in next(loader) per second of step time, in [0, 1]."""
    return ("sum by (%s) (%s)\n/\nsum by (%s) (%s)" % (
        BY_RANK, rate(cfg, "stallscope_data_wait_seconds_sum", matchers, window),
        BY_RANK, rate(cfg, "stallscope_step_seconds_sum", matchers, window)))


def steps_rate(cfg, matchers=(), window=None):
    """Per rank: batches reaching the training loop per second."""
    return "sum by (%s) (%s)" % (BY_RANK, rate(cfg, "stallscope_step_seconds_count", matchers, window))


def waiting_pods(cfg):
    """Ranks a cause matters to: waiting at least cause_min_wait_ratio, or blocked for
    good (no batch in the whole window: a dead mount hangs next() and reports no wait)."""
    n = names(cfg)
    return "%s >= %s\nor\n%s == 0" % (n["rank_ratio"], num(cfg.cause_min_wait_ratio), n["rank_steps"])


def num(x):
    """A threshold as PromQL and humans write it: 0.02, 3, 9."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def pct(x):
    """A ratio threshold for humans: 0.02 -> "2%"."""
    return "%s%%" % num(round(float(x) * 100, 6))


# -- cause signals (per pod, or per pod and container / mount / tier) ----------------------
def cfs_throttled_ratio(cfg, matchers=(), window=None):
    by = "namespace, pod, container"
    return "sum by (%s) (%s)\n/\nsum by (%s) (%s)" % (
        by, rate(cfg, "stallscope_cpu_cfs_throttled_periods_total", matchers, window),
        by, rate(cfg, "stallscope_cpu_cfs_periods_total", matchers, window))


def pressure_ratio(cfg, resource, matchers=(), window=None):
    """PSI "some": share of wall time in which some task of the pod's cgroup stalled."""
    metric = "stallscope_pressure_%s_waiting_seconds_total" % resource
    return "sum by (namespace, pod) (%s)" % rate(cfg, metric, ('pod!=""',) + tuple(matchers), window)


def shm_used_ratio(cfg, matchers=()):
    return "max by (namespace, pod) (%s / %s)" % (
        sel(cfg, "stallscope_shm_used_bytes", 'pod!=""', *matchers),
        sel(cfg, "stallscope_shm_size_bytes", 'pod!=""', *matchers))


def fuse_up(cfg, matchers=()):
    return sel(cfg, "stallscope_fuse_up", *matchers)


def fuse_probe(cfg, matchers=()):
    return sel(cfg, "stallscope_fuse_probe_seconds", *matchers)


def fuse_waiting(cfg, matchers=()):
    return sel(cfg, "stallscope_fuse_waiting_requests", *matchers)


def shard_read_quantile(cfg, q, matchers=(), window=None):
    return "histogram_quantile(%s, sum by (namespace, pod, tier, le) (%s))" % (
        num(q), rate(cfg, "stallscope_shard_read_seconds_bucket", matchers, window))


def cache_hit_ratio(cfg, matchers=(), window=None):
    by = "namespace, pod, tier"
    return "sum by (%s) (%s)\n/\nsum by (%s) (%s)" % (
        by, rate(cfg, "stallscope_cache_requests_total", ('result="hit"',) + tuple(matchers), window),
        by, rate(cfg, "stallscope_cache_requests_total", matchers, window))


def indent(expr, n=2):
    return "\n".join((" " * n + line) if line else line for line in expr.split("\n"))
