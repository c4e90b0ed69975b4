"""PromQL building blocks shared by the recording rules, the alerts and the dashboards.

Each signal is written once here, as a function of the config and of extra label
matchers (the dashboards pass their template variables, the rules pass none), so a
panel and the alert about the same thing can never drift apart.

Labels: per-rank series carry job, rank, pod, namespace and node (stallscope/vocabulary/labels.py). The SLI
rules aggregate onto exactly those five, dropping whatever the scrape adds (instance,
a PodMonitor's container/endpoint), so every join below can name its labels.
"""
from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

from .. import vocabulary

RANK = ("namespace", "job", "rank", "pod", "node")
BY_RANK = "namespace, job, rank, pod, node"
BY_POD = "namespace, pod"


def sel(cfg: Any, metric: str, *matchers: str) -> str:
    body = cfg.sel(*matchers)
    return "%s{%s}" % (metric, body) if body else metric


def rate(cfg: Any, metric: str, matchers: Sequence[str] = (), window: str | None = None) -> str:
    return "rate(%s[%s])" % (sel(cfg, metric, *matchers), window or cfg.rate_window)


# -- the SLI and its recorded names ----------------------------------------------------
def names(cfg: Any) -> dict[str, str]:
    """Recorded series names; the window is part of the name (level:metric:operations)."""
    w = cfg.rate_window
    return {
        "rank_ratio": "rank:stallscope_data_wait_ratio:rate%s" % w,
        "rank_steps": "rank:stallscope_steps:rate%s" % w,
        "job_max": "job:stallscope_data_wait_ratio:max_rate%s" % w,
        "job_median": "job:stallscope_data_wait_ratio:median_rate%s" % w,
        "job_idle": "job:stallscope_idle_accelerators:rate%s" % w,
        "job_idle_cause": "job:stallscope_idle_accelerators_by_cause:rate%s" % w,
        "job_idle_cost": "job:stallscope_idle_cost_per_day:rate%s" % w,
        "job_wait_buckets": "job_le:stallscope_data_wait_seconds_bucket:rate%s" % w,
    }


def slo_names(cfg: Any) -> dict[str, str]:
    """Recorded names of input goodput as an SLO (rules.slo_rules), per window of the
    burn-rate alerts: the SLI, the burn rate, and the job's error budget and budget left."""
    slo = cfg.slo
    out = {"budget": "job:stallscope_input_goodput_error_budget:ratio",
           "budget_left": "job:stallscope_input_goodput_error_budget_remaining:ratio_rate%s" % slo.period}
    for w in slo.windows():
        out["sli_" + w] = "job:stallscope_input_goodput_ratio:rate%s" % w
        out["burn_" + w] = "job:stallscope_input_goodput_burn_rate:rate%s" % w
    return out


def badput(cfg: Any, window: str, matchers: Sequence[str] = ()) -> str:
    """The job's input badput over ``window``: its slowest rank's share of step time
    blocked in next(loader) (Google's DATA_LOADING_SYNC). Over the rate window it is the
    job_max record; over a longer one the record's mean over it. Not each rank's share over
    the whole window, then the max: every rank of a synchronous job idles while the
    slowest waits, so the job's loss over hours is the mean of its worst rank's share
    moment by moment, whichever rank that was (a straggler that moves from rank 3 to rank
    5 halves each one's 6 h share and loses the job the same time). A moment with no batch
    has no share and is left out of the mean (data_wait_ratio)."""
    record = sel(cfg, names(cfg)["job_max"], *matchers) if matchers else names(cfg)["job_max"]
    if window == cfg.rate_window:
        return record
    return "avg_over_time(%s[%s])" % (record, window)


def job_max(cfg):
    """The job's slowest rank, from the rank-level record: for the straggler's median,
    probes and annotations. Not from the job-level record: a rule evaluator that reads
    recorded series back from its store (vmalert, with VictoriaMetrics) sees a record of
    a record one evaluation later (docs/deploy.md). The headline alerts compute it from
    the raw series (job_max_now). Dashboards keep the job-level records."""
    return "max by (namespace, job) (%s)" % names(cfg)["rank_ratio"]


def job_max_now(cfg):
    """The job's slowest rank computed from the raw series at evaluation time, for the
    headline alerts. Through a record it is one evaluation late wherever the record is
    evaluated apart from the alert: on Prometheus another group runs at its own offset
    in the interval, and vmalert writes a record to its store and reads it back (chaining
    records is unreliable even within a group: VictoriaMetrics' vmalert README,
    "Limitations"). At a 60 s interval the scale rig measured the alert 186-189 s after a
    straggler began, past `for:` plus two evaluations (180 s; issue 20); from the raw
    series the alert is one scrape plus one evaluation plus `for:` behind it. The
    formula is the record's own (data_wait_ratio): one definition, read twice."""
    return "max by (namespace, job) (\n%s\n)" % indent(data_wait_ratio(cfg))


def job_median(cfg):
    """The job's median rank (see job_max)."""
    return "quantile by (namespace, job) (0.5, %s)" % names(cfg)["rank_ratio"]


def data_wait_ratio(cfg: Any, matchers: Sequence[str] = (), window: str | None = None) -> str:
    """Per rank: seconds blocked in next(loader) per second of step time, in [0, 1].
    A window in which no batch arrived has no ratio, not NaN (both rates 0): one NaN in a
    recorded series makes every avg_over_time or sum_over_time over it NaN, and a job's
    lost hours NaN sorted anywhere in ``stallscope top`` (CI: a slowed rank's first batch
    took longer than the live test's 10 s window). NaN never fired an alert either."""
    return ("sum by (%s) (%s)\n/\n(sum by (%s) (%s) > 0)" % (
        BY_RANK, rate(cfg, "stallscope_data_wait_seconds_sum", matchers, window),
        BY_RANK, rate(cfg, "stallscope_step_seconds_sum", matchers, window)))


def steady_data_wait_ratio(cfg: Any, matchers: Sequence[str] = (), window: str | None = None) -> str:
    """Per rank: the data-wait share without the batches that started an iterator (each
    epoch's first batch, its workers' start-up): the agent's steady_data_wait_ratio, from
    the counters (issue 29: both diagnose paths give the same steady wait). Numerator and
    denominator move together when a batch arrives, so their ratio over a window is exact,
    where the whole wait's sum less a counter of iterator starts is not (the sum grows
    while next() blocks, such a counter when the batch comes: a 30 s window's rates of the
    two disagreed by a whole epoch start)."""
    # the steady batches' step time: the loop's compute (step sum less wait sum: both grow
    # alike while next() blocks, and an iterator's first batch, all wait, adds none) plus
    # their wait, all of it moving when a batch arrives
    steady = "sum by (%s) (%s)" % (BY_RANK, rate(cfg, "stallscope_steady_data_wait_seconds_total",
                                                 matchers, window))
    return ("%s\n/\n((sum by (%s) (%s) - sum by (%s) (%s) + %s) > 0)" % (
        steady, BY_RANK, rate(cfg, "stallscope_step_seconds_sum", matchers, window),
        BY_RANK, rate(cfg, "stallscope_data_wait_seconds_sum", matchers, window), steady))


def handoff_ratio(cfg: Any, matchers: Sequence[str] = (), window: str | None = None) -> str:
    """Per rank: the share of the step time spent handing batches over (the waits less
    their ready wait: hook/transfer.py), the agent's transfer.handoff_ratio from the
    counters; with the data-wait share it says whether the loader keeps up (rules.py)."""
    return "sum by (%s) (%s)\n/\n(sum by (%s) (%s) > 0)" % (
        BY_RANK, rate(cfg, "stallscope_data_transfer_seconds_total", matchers, window),
        BY_RANK, rate(cfg, "stallscope_step_seconds_sum", matchers, window))


def steps_rate(cfg, matchers=(), window=None):
    """Per rank: batches reaching the training loop per second."""
    return "sum by (%s) (%s)" % (BY_RANK, rate(cfg, "stallscope_step_seconds_count", matchers, window))


def waiting_pods(cfg):
    """Ranks a cause matters to: waiting at least the data-wait line, or blocked for
    good (no batch in the whole window: a dead mount hangs next() and reports no wait)."""
    n = names(cfg)
    return "%s >= %s\nor\n%s == 0" % (n["rank_ratio"], num(cfg.data_wait_warning), n["rank_steps"])


def num(x):
    """A threshold as PromQL and humans write it: 0.02, 3, 9."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def pct(x):
    """A ratio threshold for humans: 0.02 -> "2%"."""
    return "%s%%" % num(round(float(x) * 100, 6))


# -- cause signals: the vocabulary's queries, rendered -------------------------------------
def signal(cfg: Any, name: str, matchers: Sequence[str] = (), window: str | None = None) -> str:
    """The Prometheus face of vocabulary signal ``name`` (per pod, or per pod and
    container / mount / tier), with the configured selector and ``matchers``."""
    query = vocabulary.signal(name).query
    if not query:
        raise ValueError("signal %s has no query in the vocabulary" % name)
    text = string.Template(query).substitute(sel=cfg.sel(*matchers), w=window or cfg.rate_window)
    # An empty selector body leaves "{}" or a dangling comma: drop them.
    return re.sub(r"\{\s*\}", "", re.sub(r",\s*\}", "}", text))


def shard_read_quantile(cfg, q, matchers=(), window=None):
    return "histogram_quantile(%s, sum by (namespace, pod, tier, le) (%s))" % (
        num(q), rate(cfg, "stallscope_shard_read_seconds_bucket", matchers, window))


def indent(expr, n=2):
    return "\n".join((" " * n + line) if line else line for line in expr.split("\n"))
