"""Job overview: is the job waiting on data, which ranks, since when, and what the GPU
and the correlator say about it."""
from .. import config, promql
from ..promql import num, pct
from . import node
from .panels import (
    BATCHES_PER_SECOND,
    EVENTS_PER_SECOND,
    HEATMAP,
    RATE,
    TABLE,
    VARS_RANK,
    Board,
    bars,
    drill_down_url,
    field_link,
    heat,
    history,
    q,
    single,
    tabular,
    ts,
)

UID = "overview"


def _m(cfg, metric, *extra):
    return promql.sel(cfg, metric, *(VARS_RANK + extra))


def budget_spent(cfg, matchers, by="namespace, job"):
    """Each job's error budget spent over the dashboard's time range: its mean input
    badput (the slowest rank's wait share, moment by moment) over its error budget; 1 is
    the whole budget of the time it ran. For "how much budget did this job spend this
    week": set the time range to the last 7 days."""
    n, s = promql.names(cfg), promql.slo_names(cfg)
    return "max by (%s) (\n  avg_over_time(%s[$__range])\n  /\n  last_over_time(%s[$__range])\n)" % (
        by, promql.sel(cfg, n["job_max"], *matchers), promql.sel(cfg, s["budget"], *matchers))


def hours_lost(cfg, record, matchers, by):
    """Accelerator-hours of idle-accelerator ``record`` over the range, per ``by``: a
    sample every $__interval (Grafana's, from the range and the panel's width), each
    standing for that long."""
    return "sum by (%s) (sum_over_time(%s[$__range:$__interval])) * $__interval_ms / 3600000" % (
        by, promql.sel(cfg, record, *matchers))


def slo_row(b, cfg, job_sel):
    """Input goodput as an SLO: the SLI and burn rate over each window the alerts read,
    the budget left over the SLO period, the budget spent over the time range and on what
    (accelerator-hours lost by cause, and the budget by cause)."""
    n, s, slo = promql.names(cfg), promql.slo_names(cfg), cfg.slo
    pages = sorted({b_.factor for b_ in slo.burns if b_.severity == "critical"})
    by_job = "namespace, job"
    short = slo.windows()[0]
    b.row("Input goodput SLO (target %s; error budget %s of step time)" % (pct(slo.target), pct(slo.budget)))
    b.add(
        single("Input goodput (%s)" % short, "1 - the slowest rank's share of step time "
               "blocked in next(loader) over the last %s, the worst selected job (recorded as %s). "
               "The same figure as Google's goodput: 1 - DATA_LOADING_SYNC badput's share."
               % (short, s["sli_" + short]),
               q("min(%s)" % promql.sel(cfg, s["sli_" + short], *job_sel)), "percentunit"),
        single("Error budget left (%s)" % slo.period, "Share of the error budget left over the last "
               "%s (the SLO period): 1 - the mean badput over it / the budget; below 0 once "
               "overspent. The selected job that has least left (recorded as %s)."
               % (slo.period, s["budget_left"]),
               q("min(%s)" % promql.sel(cfg, s["budget_left"], *job_sel)), "percentunit"),
        single("Error budget spent over the time range", "The selected jobs' error budget spent over "
               "the dashboard's time range, the most any spent: their mean badput over the range / "
               "the budget (1 = all of it; set the range to the last 7 days for the week).",
               q("max(%s)" % budget_spent(cfg, job_sel)), "percentunit", warn=1),
        single("Accelerator-hours lost over the time range", "Accelerator-hours the selected jobs idled "
               "on input wait over the time range: world size x the straggler's waiting share, "
               "integrated (%s)." % n["job_idle"],
               q("sum(%s)" % hours_lost(cfg, n["job_idle"], job_sel, by_job))),
        ts("Burn rate per window", "How many times faster than the SLO allows each job spends its error "
           "budget, over each window the burn-rate alerts read (recorded as %s). Pages fire while a "
           "long window and its short one both exceed %s; the ticket at 1x over %s." % (
               s["burn_" + slo.windows()[0]].replace(slo.windows()[0], "<window>"),
               " or ".join("%sx (%s and %s)" % (num(b_.factor), b_.long, b_.short)
                           for b_ in slo.burns if b_.severity == "critical"),
               " and ".join("%s and %s" % (b_.long, b_.short)
                            for b_ in slo.burns if b_.severity == "warning")),
           [q(promql.sel(cfg, s["burn_" + w], *job_sel), "{{namespace}}/{{job}} %s" % w)
            for w in slo.windows()],
           "short", min_val=0, warn=1, crit=pages[0] if pages else None),
        ts("Input goodput per window", "The SLI over each window the alerts read (recorded as %s): "
           "1 - the mean of the slowest rank's wait share over it." % (
               s["sli_" + slo.windows()[0]].replace(slo.windows()[0], "<window>")),
           [q(promql.sel(cfg, s["sli_" + w], *job_sel), "{{namespace}}/{{job}} %s" % w)
            for w in slo.windows()],
           "percentunit", max_val=1),
        tabular("Accelerator-hours lost by cause over the SLO period (%s)" % slo.period, "Per job, the "
                "accelerator-hours lost to input wait over the last %s (the budget-left window) by the "
                "cause the correlator scored best at each moment (%s, sampled every %s, the rate "
                "window it is an average over)." % (slo.period, n["job_idle_cause"], cfg.rate_window),
                [q("sort_desc(sum by (%s, cause) (sum_over_time(%s[%s:%s])) * %g / 3600)" % (
                    by_job, promql.sel(cfg, n["job_idle_cause"], *job_sel), slo.period, cfg.rate_window,
                    config.seconds(cfg.rate_window)), instant=True, fmt=TABLE)]),
        tabular("Accelerator-hours lost by cause over the time range", "Per job, the accelerator-hours "
                "lost to input wait over the time range by the cause the correlator scored best at "
                "each moment (%s); time before a cause was scored is in the total, not here."
                % n["job_idle_cause"],
                [q("sort_desc(%s)" % hours_lost(cfg, n["job_idle_cause"], job_sel, by_job + ", cause"),
                   instant=True, fmt=TABLE)]),
        tabular("Error budget spent by cause over the time range", "Per job, the error budget spent "
                "over the time range split by cause in proportion to the accelerator-hours each "
                "cause lost: the answer to \"how much budget did this job spend this week, and on "
                "what\" (range: last 7 days).",
                [q("sort_desc(\n(%s)\n/ on (namespace, job) group_left ()\n(%s)\n* on (namespace, job) "
                   "group_left ()\n%s\n)" % (
                       hours_lost(cfg, n["job_idle_cause"], job_sel, by_job + ", cause"),
                       hours_lost(cfg, n["job_idle"], job_sel, by_job), budget_spent(cfg, job_sel)),
                   instant=True, fmt=TABLE)], "percentunit"),
    )


def build(cfg):
    n = promql.names(cfg)
    ratio = _m(cfg, n["rank_ratio"])
    job_sel = ('namespace=~"$namespace"', 'job=~"$job"')
    warn, crit = cfg.data_wait_warning, cfg.data_wait_page
    b = Board(cfg, UID, "stallscope / Job overview",
              "Are the GPUs waiting on the input pipeline, on which rank, and why?")
    b.link("Node and pod drill-down", "node")

    b.row("Is the job waiting on data?")
    b.add(
        single("Worst rank: data-wait", "Largest share of step time any selected rank spent "
               "blocked in next(loader) over the last %s (recorded as %s). Above %s for %s opens "
               "the ticket StallscopeDataWaitHigh; in synchronous training every rank runs at this "
               "rank's pace."
               % (cfg.rate_window, n["job_max"], pct(warn), cfg.data_wait_for),
               q("max(%s)" % ratio), "percentunit", warn=warn, crit=crit),
        single("Median rank: data-wait", "The job's median rank. Close to the worst: the whole job "
               "starves (shared storage, the dataset itself). Far below it: one straggler (its node or pod).",
               q("quantile(0.5, %s)" % ratio), "percentunit", warn=warn, crit=crit),
        single("Ranks reporting", "Ranks whose hook reported batches in the window. Fewer than the "
               "job's world size: some ranks are not instrumented or lost the agent's socket.",
               q("count(%s)" % ratio)),
        single("Slowest rank: batches/s", "Batches per second reaching the training loop of the "
               "slowest selected rank: the pace of the whole job.",
               q("min(%s)" % _m(cfg, n["rank_steps"])), BATCHES_PER_SECOND),
        ts("Data-wait: worst and median rank per job", "Share of step time blocked in next(loader), "
           "per job: the worst rank (solid) and the median rank. Dashed lines: the SLO's line (%s, "
           "a ticket when it holds) and the share that pages when it holds (%s, the slow-burn "
           "page's)." % (pct(warn), pct(crit)),
           [q(promql.sel(cfg, n["job_max"], *job_sel), "{{namespace}}/{{job}} worst"),
            q(promql.sel(cfg, n["job_median"], *job_sel), "{{namespace}}/{{job}} median")],
           "percentunit", w=24, min_val=0, warn=warn, crit=crit),
        ts("Idle accelerators (input wait)", "Accelerators idle on input wait, per job (recorded "
           "as %s): world size x the straggler's waiting share, since every rank of a synchronous "
           "job idles while the straggler waits; x 24 is GPU-hours lost a day%s. By cause: the "
           "job's best-scored cause (%s)." % (n["job_idle"], ", priced at %g per GPU-hour" %
                                              cfg.gpu_hour_price if cfg.gpu_hour_price else "",
                                              n["job_idle_cause"]),
           [q(promql.sel(cfg, n["job_idle"], *job_sel), "{{namespace}}/{{job}}"),
            q(promql.sel(cfg, n["job_idle_cause"], *job_sel), "{{namespace}}/{{job}} {{cause}}")]
           + ([q(promql.sel(cfg, n["job_idle_cost"], *job_sel), "{{namespace}}/{{job}} cost/day")]
              if cfg.gpu_hour_price else []),
           "short", w=24, min_val=0),
        field_link(tabular(
            "Slowest ranks", "The %d ranks with the largest data-wait share now, with their pod "
            "and node: a pod links the node and pod drill-down for its rank; start `stallscope "
            "diagnose <pod> -n <namespace>` with the first row." % cfg.topk,
            [q("topk(%d, %s)" % (cfg.topk, ratio), instant=True, fmt=TABLE)], "percentunit"),
            "pod", "Node and pod drill-down for this rank", drill_down_url(cfg, node.UID)),
        field_link(tabular(
            "Firing stallscope alerts", "Stallscope alerts firing now for the selected namespaces. "
            "An alert's name links its runbook (runbook_base_url + name + .md, from the mixin "
            "config: an ALERTS series carries the alert's labels, not its runbook_url annotation).",
            [q('ALERTS{alertname=~"Stallscope.*", alertstate="firing", namespace=~"$namespace"}',
               instant=True, fmt=TABLE)], hide=("Time", "Value", "__name__", "alertstate")),
            "alertname", "Runbook", cfg.runbook_url("${__value.raw}"), new_tab=True),
        history("Data-wait per rank", "One row per rank, one cell per interval, coloured by the "
                "rank's data-wait share (the per-rank heatmap): a single hot row is a straggler, "
                "a hot column a job-wide stall, stripes a periodic stall.",
                q(ratio, "{{job}} rank {{rank}}"), warn=warn, crit=crit),
        heat("Data-wait per batch (distribution)", "How long single next(loader) calls blocked, "
             "all ranks of the selected jobs together (histogram buckets, over %s, from a recording "
             "rule: summing every rank's buckets at view time grows with the job). Prefetched "
             "batches sit in the lowest band; a band at seconds means batches that were not "
             "ready at all." % cfg.rate_window,
             q("sum by (le) (%s)" % promql.sel(cfg, n["job_wait_buckets"], *job_sel),
               "{{le}}", fmt=HEATMAP), w=24),
    )

    slo_row(b, cfg, job_sel)

    b.row("Step time and GPU")
    by = "namespace, job, rank"
    b.add(
        ts("Step time per rank (mean)", "Mean interval between consecutive batches reaching the "
           "loop: compute plus data-wait. In synchronous training all ranks share the slowest one's.",
           [q("sum by (%s) (%s)\n/\nsum by (%s) (%s)" % (
               by, promql.rate(cfg, "stallscope_step_seconds_sum", VARS_RANK, RATE),
               by, promql.rate(cfg, "stallscope_step_seconds_count", VARS_RANK, RATE)),
              "{{job}} rank {{rank}}")],
           "s", min_val=0),
        ts("Data-wait per batch per rank (mean)", "Mean time one next(loader) call blocked. Compare "
           "with the step time: the difference is what the loop spends on compute.",
           [q("sum by (%s) (%s)\n/\nsum by (%s) (%s)" % (
               by, promql.rate(cfg, "stallscope_data_wait_seconds_sum", VARS_RANK, RATE),
               by, promql.rate(cfg, "stallscope_data_wait_seconds_count", VARS_RANK, RATE)),
              "{{job}} rank {{rank}}")],
           "s", min_val=0),
        ts("GPU busy and SM active against data-wait", "Per rank: GPU busy (NVML busy seconds "
           "per second, so no on/off pattern is lost between scrapes) and SM active (DCGM) "
           "against the data-wait share. GPU dips that line up with data-wait are input "
           "stalls; dips without data-wait are something else (collectives, host sync).",
           [q("avg by (%s) (%s)" % (
               by, promql.rate(cfg, "stallscope_gpu_busy_seconds_total", VARS_RANK, RATE)),
              "busy {{job}} rank {{rank}}"),
            q("avg by (%s) (%s)" % (by, _m(cfg, "stallscope_gpu_sm_active_ratio")),
              "SM active {{job}} rank {{rank}}"),
            q(ratio, "data-wait {{job}} rank {{rank}}")],
           "percentunit", min_val=0, max_val=1),
        ts("GPU idle time spent waiting for data", "Share of the GPU's idle time that overlaps the "
           "rank's data-wait (the correlator's measure). High: the GPU idles because the input "
           "pipeline is late. Low with an idle GPU: the rank waits elsewhere, e.g. for a straggler.",
           [q(_m(cfg, "stallscope_gpu_idle_overlap_ratio"), "{{job}} rank {{rank}}")],
           "percentunit", min_val=0, max_val=1),
    )

    def per_gpu(metric, *extra):
        """A pod's bytes a second from ``metric``, per rank of the pod (one rank per GPU)."""
        return "sum by (namespace, pod) (%s)\n/ on (namespace, pod)\ncount by (namespace, pod) (%s)" % (
            promql.rate(cfg, metric, job_sel + extra, RATE), ratio)

    b.row("Why: the correlator and the loader")
    b.add(
        bars("Cause scores", "The correlator's score per candidate cause (0-1), the worst over the "
             "selected ranks: how well the cause's signal moves with the stalls, not how high it is. "
             "`stallscope diagnose` shows the evidence behind each.",
             [q("max by (cause) (%s)" % _m(cfg, "stallscope_stall_cause_score"), "{{cause}}", instant=True)]),
        ts("Stall period (batches)", "Dominant period of the data-wait spikes in batches, 0 when "
           "none. A period equal to num_workers: each worker is slower than num_workers x compute "
           "(too few workers or slow per-sample work); a long fixed period: e.g. checkpoint writes.",
           [q(_m(cfg, "stallscope_stall_period_steps"), "{{job}} rank {{rank}}")], "short", min_val=0),
        ts("Bytes read per GPU against the demand", "Do the bytes/s math first (issue 31): per "
           "pod, the bytes a second its loaders read per GPU (rank), from the shard reads the "
           "loaders report (what each tier served) and from the kernel's count of the workers' "
           "read() calls (/proc/<pid>/io; a socket's recv() is not in it), and the demand: what "
           "the shard reads would be with no data-wait (the rate over the share of the step not "
           "waiting), the pace the compute asks for. Demand far above what is read, with a link "
           "at capacity, is bandwidth_bound: more workers share the same link.",
           [q(per_gpu("stallscope_shard_read_bytes_total"), "shard reads {{namespace}}/{{pod}}"),
            q(per_gpu("stallscope_loader_read_bytes_total", 'io="all"'), "read() {{namespace}}/{{pod}}"),
            q("(%s)\n/ on (namespace, pod)\n(1 - max by (namespace, pod) (%s))" % (
                per_gpu("stallscope_shard_read_bytes_total"), ratio), "demand {{namespace}}/{{pod}}")],
           "Bps", w=24, min_val=0),
        tabular("Loader configuration", "DataLoader settings each rank reported: few workers, no "
                "prefetch or no pinned memory are the first things to check on a waiting rank.",
                [q(_m(cfg, "stallscope_loader_info"), instant=True, fmt=TABLE)], w=24,
                hide=("Time", "Value", "__name__", "instance")),
        ts("Hook events dropped", "Batch events the hook could not deliver to the agent, per "
           "second. Non-zero: the agent was down or slow, and data-wait figures undercount.",
           [q("sum by (%s) (%s)" % (
               by, promql.rate(cfg, "stallscope_hook_dropped_events_total", VARS_RANK, RATE)),
              "{{job}} rank {{rank}}")], EVENTS_PER_SECOND, min_val=0),
    )
    return b.model()

