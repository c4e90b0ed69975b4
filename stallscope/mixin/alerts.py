"""Alert rules, in the monitoring-mixin style: `Stallscope` prefix, a `severity` label,
a one-sentence `summary`, a templated `description` naming job, rank, pod and node, and a
`runbook_url` (added by rules.py from the config). Prometheus 2.42 features only.

Every alert also carries a ``probe``: its expression without the threshold (and, for the
cause alerts, joined to every rank rather than only the waiting ones). The real-Prometheus
tests require each probe to return data, which proves the metrics exist and the label
joins match; the threshold itself is proven by the promtool unit tests.
"""
import dataclasses
import re

from .. import vocabulary
from . import promql
from .promql import indent, num, pct

CAUSE_JOIN = "* on (namespace, pod) group_left (job, node)"
# The seed's "2 % for 15 m": input goodput's SLO at 1x burn, a ticket (severity warning);
# the burn-rate pages (config.SLO.burns) inhibit it for their job (rules.inhibit_rules).
TICKET = "StallscopeDataWaitHigh"


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
        n["rank_ratio"], num(cfg.data_wait_warning), n["rank_steps"]),
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
    job_max = promql.job_max_now(cfg)  # not the record: one evaluation sooner (issue 20)
    if cfg.slo.targets:
        # per-job SLO targets: each job's line is its own error budget (the record is
        # constant, so reading it costs no freshness)
        cmp = "%s\n> on (namespace, job) group_left ()\n%s" % (job_max, promql.slo_names(cfg)["budget"])
        line = _query("%s{namespace=%%q, job=%%q}" % promql.slo_names(cfg)["budget"],
                      "$labels.namespace", "$labels.job")
        line = "{{ with %s }}{{ . | first | value | humanizePercentage }}{{ end }}" % line
    else:
        cmp, line = "%s > %s" % (job_max, num(threshold)), pct(threshold)
    return Alert(
        name, "stallscope.slo", severity, cfg.data_wait_for, cmp, promql.job_max(cfg),
        "Training job {{ $labels.namespace }}/{{ $labels.job }} is waiting on its input pipeline.",
        "The slowest rank of job {{ $labels.job }} spent {{ $value | humanizePercentage }} of its "
        "step time blocked in next(loader) over the last %s (threshold %s); in synchronous "
        "training every rank runs at its pace: %s." % (
            cfg.rate_window, line, _worst_rank(cfg)),
        ("stallscope_data_wait_seconds", "stallscope_step_seconds"))


def _job_record(record, then):
    """``{{ with <record of this alert's job> }}<then>{{ end }}``."""
    return "{{ with %s }}%s{{ end }}" % (_query("%s{namespace=%%q, job=%%q}" % record, "$labels.namespace",
                                                 "$labels.job"), then)


def _burn(cfg, b):
    """A multi-window burn-rate alert (config.Burn) on the job's input goodput."""
    n = promql.slo_names(cfg)
    page = b.severity == "critical"
    expr = "%s > %s\nand on (namespace, job)\n%s > %s" % (
        n["burn_" + b.long], num(b.factor), n["burn_" + b.short], num(b.factor))
    first = "{{ . | first | value | %s }}"
    return Alert(
        b.alert, "stallscope.slo", b.severity, b.for_, expr, n["burn_" + b.long],
        "Training job {{ $labels.namespace }}/{{ $labels.job }} spends its input-goodput error budget "
        "at %sx the pace its SLO allows%s." % (num(b.factor), "" if page else " (a ticket)"),
        "Job {{ $labels.job }} spent its input-goodput error budget at {{ printf \"%%.3g\" $value }}x "
        "the allowed pace over the last %s and at %sx over the last %s (this alert: over %sx in both; "
        "input goodput is 1 - the slowest rank's share of step time blocked in next(loader), its "
        "error budget %s of step time). %s of the budget over the last %s is left. In synchronous "
        "training every rank runs at the slowest's pace: %s." % (
            b.long, _job_record(n["burn_" + b.short], first % 'printf "%.3g"'), b.short, num(b.factor),
            _job_record(n["budget"], first % "humanizePercentage"),
            _job_record(n["budget_left"], first % "humanizePercentage"), cfg.slo.period,
            _worst_rank(cfg)),
        ("stallscope_data_wait_seconds", "stallscope_step_seconds"))


def _straggler(cfg):
    n = promql.names(cfg)
    expr = ("%s\n> on (namespace, job) group_left ()\n(%s * %s)\nand\n%s > %s" % (
        n["rank_ratio"], num(cfg.straggler_factor), promql.job_median(cfg), n["rank_ratio"],
        num(cfg.data_wait_warning)))
    probe = "%s\n* on (namespace, job) group_left ()\n(%s >= 0)" % (n["rank_ratio"], promql.job_median(cfg))
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


def _worker_killed(cfg):
    # An event, not a level: the pod's counter rose (each reason is exported from 0).
    exits = promql.sel(cfg, "stallscope_loader_worker_exits_total", 'reason!="other"')
    expr = "increase(%s[%s]) > 0" % (exits, cfg.rate_window)
    return Alert(
        "StallscopeLoaderWorkerKilled", "stallscope.causes", "warning", "0m", expr, exits,
        "A DataLoader worker of pod {{ $labels.namespace }}/{{ $labels.pod }} died ({{ $labels.reason }}).",
        "A loader worker of %s ended by a signal within the last %s; the agent's "
        "evidence says {{ $labels.reason }} (shm_exhaustion: /dev/shm was full; memory_limit: the "
        "OOM killer of the pod's memory cgroup; native_crash: a crash in native code; killed: "
        "another SIGKILL). `stallscope diagnose {{ $labels.pod }} -n {{ $labels.namespace }}` "
        "names the worker, its last RSS and the limit." % (_pod_where(cfg), cfg.rate_window),
        ("stallscope_loader_worker_exits_total",))


def _loader_error(cfg):
    # An event, not a level, as a worker's death is: the pod's counter rose. The cause is
    # the one the error's own message names (correlate/loader_errors.py, issue 32): on
    # torch 2.13 a full /dev/shm kills no worker, so StallscopeLoaderWorkerKilled is silent.
    errors = promql.sel(cfg, "stallscope_loader_errors_total", 'cause!="other"')
    expr = "increase(%s[%s]) > 0" % (errors, cfg.rate_window)
    return Alert(
        "StallscopeLoaderError", "stallscope.causes", "warning", "0m", expr, errors,
        "The DataLoader of pod {{ $labels.namespace }}/{{ $labels.pod }} raised ({{ $labels.cause }}).",
        "A trainer of %s stopped within the last %s on its DataLoader's own error, which names "
        "{{ $labels.cause }} (shm_exhaustion: a worker could not allocate a batch in /dev/shm). "
        "`stallscope diagnose {{ $labels.pod }} -n {{ $labels.namespace }}` shows the error and "
        "the /dev/shm size that would have been enough." % (_pod_where(cfg), cfg.rate_window),
        ("stallscope_loader_errors_total",))


def _line_text(signal, value):
    return vocabulary.unit_text(vocabulary.signal(signal).unit, value)


def _cause_alert(cfg, a):
    """A cause alert of the vocabulary (stallscope/vocabulary/causes.py)."""
    line = cfg.line(a.name)
    description = (a.description.replace("<where>", _pod_where(cfg))
                   .replace("<window>", cfg.rate_window).replace("<line>", _line_text(a.signal, line)))
    metrics = tuple(sorted(set(re.findall(r"stallscope_[a-z_]+?(?=_bucket\b|_sum\b|_count\b|\{|\[|\s|\)|$)",
                                          vocabulary.signal(a.signal).query))))
    return _cause(cfg, a.name, promql.signal(cfg, a.signal), "%s %s" % (a.op, num(line)), metrics,
                  a.summary, description)


def _causes(cfg):
    return [_cause_alert(cfg, a) for c in vocabulary.CAUSES for a in c.alerts]


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
    up_now = "(%s == 1)" % up
    last_seen = "group by (namespace, job, pod, node, instance) (last_over_time(%s[%s]))" % (
        step_count, cfg.silent_lookback)
    unwatched = "%s\nunless on (namespace, job)\n%s\nand on (instance)\n%s" % (last_seen, step_count, up_now)
    unwatched_probe = "%s\nand on (instance)\n%s" % (last_seen, up_now)
    if cfg.pod_running:
        unwatched += "\nand on (namespace, pod)\n(%s)" % cfg.pod_running
    one_pod = ("{{ with %s }}{{ with first . }}, e.g. pod {{ label \"pod\" . }} on node "
               "{{ label \"node\" . }}{{ end }}{{ end }}" % _query(
                   "topk(1, last_over_time(stallscope_step_seconds_count{%s}[%s]))" % (
                       cfg.sel("namespace=%q", "job=%q"), cfg.silent_lookback),
                   "$labels.namespace", "$labels.job"))
    # A series that lost its training job's labels: the scrape renamed them (exported_*)
    # or the agent's series arrived without them.
    unlabelled = " or ".join(promql.sel(cfg, "stallscope_step_seconds_count", m) for m in (
        'exported_job!=""', 'exported_namespace!=""', 'namespace=""'))
    honor = "count by (job, instance) (\n  %s\n)\nand on (instance)\n%s" % (unlabelled, up_now)
    return [
        Alert("StallscopeJobNotWatched", "stallscope.health", "warning", cfg.health_for,
              "count by (namespace, job) (\n%s\n)" % indent(unwatched),
              "count by (namespace, job) (\n%s\n)" % indent(unwatched_probe),
              "No rank of job {{ $labels.namespace }}/{{ $labels.job }} reports while its pods run.",
              "The hooks of job {{ $labels.job }} reported within the last %s and none reports now, "
              "while {{ $value }} of its pods still run%s%s, and the agents that carried their series "
              "are up: the training loop stopped being watched (a framework upgrade that no longer "
              "calls the wrapped loader, the hook turned off, the agent's socket not mounted into a "
              "restarted pod). Every other stallscope alert about this job is silent until it "
              "reports again." % (cfg.silent_lookback, " (%s)" % cfg.pod_running.split("{")[0].split()[0]
                                   if cfg.pod_running else "", one_pod),
              ("stallscope_step_seconds",)),
        Alert("StallscopeHonorLabelsMissing", "stallscope.health", "warning", cfg.health_for,
              honor, "count by (job, instance) (%s)\nand on (instance)\n%s" % (
                  promql.sel(cfg, "stallscope_step_seconds_count"), up),
              "The stallscope agent at {{ $labels.instance }} is scraped without the training jobs' labels.",
              "{{ $value }} step series the agent at {{ $labels.instance }} serves reach Prometheus (scrape "
              "job {{ $labels.job }}) without their training job's namespace and job: the scrape lacks "
              "`honor_labels: true`, so Prometheus renamed them exported_job and exported_namespace. No "
              "SLI, burn-rate or cause alert matches them: every job on that node goes unwatched.",
              ("stallscope_step_seconds",)),
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
              "The hook of rank {{ $labels.rank }} of job {{ $labels.namespace }}/{{ $labels.job }} "
              "drops events.",
              "The hook of rank {{ $labels.rank }} (pod {{ $labels.pod }} on node {{ $labels.node }}) could "
              "not deliver {{ printf \"%%.2f\" $value }} batch events per second to the agent over the "
              "last %s: its data-wait figures undercount." % cfg.rate_window,
              ("stallscope_hook_dropped_events_total",)),
    ]



def all_alerts(cfg):
    return ([_burn(cfg, b) for b in cfg.slo.burns]
            + [_headline(cfg, TICKET, "warning", cfg.data_wait_warning), _straggler(cfg), _no_progress(cfg)]
            + _causes(cfg) + [_worker_killed(cfg), _loader_error(cfg)] + _health(cfg))
