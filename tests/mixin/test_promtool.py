"""The committed rule files under promtool: `check rules`, and one `test rules` unit test
per alert that checks the `for:` boundary (pending one minute before, firing at it) and
the exact labels and annotations, runbook_url included. Each case also carries series
that must NOT fire (a healthy job, a throttled pod whose rank does not wait ...).

A cause alert's case is derived from its vocabulary entry (tests/helpers/alertcases.py:
its signal's query, comparison and line, the config's ``cause_for``, its summary and
description), with the signal just past the line firing and just before it not; only the
alerts whose expression is mixin code (the headline, straggler, progress, worker-death and
health alerts) keep a hand-written entry in CASES. An alert with neither fails, and a cause
alert whose case cannot be derived fails saying why (fix the derivation, not CASES)."""
import dataclasses
import json
import os
import re
import shutil
import subprocess

import pytest

from stallscope import vocabulary
from stallscope.mixin import alerts, config, generate, promql, rules
from tests.helpers import ROOT
from tests.helpers.alertcases import CannotDerive, cause_case, humanize_percentage

RULE_FILES = [os.path.join(ROOT, "alerts", "rules.yaml"), os.path.join(ROOT, "alerts", "alerts.yaml")]
RUNBOOKS = "https://github.com/stallscope/stallscope/blob/main/runbooks/"
GROUPS = ["stallscope.sli", "stallscope.input_goodput", "stallscope.distribution", "stallscope.slo",
          "stallscope.causes", "stallscope.health"]
AGENT = dict(job="stallscope", instance="10.0.0.1:9478")
POD0 = dict(job="train", namespace="ml", pod="train-0", node="n1", instance="10.0.0.1:9478")
WHERE0 = "pod ml/train-0 (job train, node n1)"

SLI_RULES = sum(len(g["rules"]) for g in rules.recording_groups(config.DEFAULT))

pytestmark = pytest.mark.skipif(not shutil.which("promtool"),
                                reason="needs promtool (apt-get install prometheus)")


def sel(metric, **labels):
    return "%s{%s}" % (metric, ",".join('%s="%s"' % kv for kv in sorted(labels.items())))


def rank(r, wait_per_min, job="train", pod=None, steps_per_min=600, node="n1", minutes=40):
    """A rank's hook series: 60 s of steps per minute, ``wait_per_min`` of them waiting."""
    labels = dict(job=job, rank=str(r), pod=pod or "%s-%d" % (job, r), namespace="ml", node=node,
                  instance="10.0.0.1:9478")
    return [(sel("stallscope_data_wait_seconds_sum", **labels), "0+%gx%d" % (wait_per_min, minutes)),
            (sel("stallscope_step_seconds_sum", **labels), "0+%gx%d" % (60 if steps_per_min else 0, minutes)),
            (sel("stallscope_step_seconds_count", **labels), "0+%gx%d" % (steps_per_min, minutes))]


def pod_labels(pod, **extra):
    return dict(POD0, pod=pod, **extra)


def waiting_pair():
    """train-0 waits 5 % (matters); train-1 waits 1 % (below cause_min_wait_ratio)."""
    return rank(0, 3) + rank(1, 0.6)


# Hand-written, for the alerts whose expression is mixin code rather than a vocabulary
# line: name -> (series, minute the condition turns true, expected alerts [(labels,
# summary, description)]).
CASES = {
    "StallscopeDataWaitHigh": (
        waiting_pair() + rank(0, 0.6, job="calm"), 1,
        [(dict(namespace="ml", job="train"), "Training job ml/train is waiting on its input pipeline.",
          "The slowest rank of job train spent 5% of its step time blocked in next(loader) over the "
          "last 5m (threshold 2%); in synchronous training every rank runs at its pace: the slowest "
          "is rank 0 (pod train-0 on node n1); run `stallscope diagnose train-0 -n ml`.")]),
    "StallscopeStragglerRank": (
        rank(0, 6) + rank(1, 0.6) + rank(2, 0.6) + sum((rank(r, 6, job="even") for r in range(3)), []), 1,
        [(dict(namespace="ml", job="train", rank="0", pod="train-0", node="n1"),
          "Rank 0 of job ml/train waits for data far longer than the job's other ranks.",
          "Rank 0 (pod train-0 on node n1) spent 10% of its step time waiting for data over the last "
          "5m, more than 3 times the job's median (1%): the cause is local to that pod or node.")]),
    "StallscopeJobNoProgress": (
        # train: both ranks blocked (counters flat); busy: one rank still steps
        rank(0, 0, steps_per_min=0) + rank(1, 0, steps_per_min=0)
        + rank(0, 0, job="busy", steps_per_min=0) + rank(1, 0.6, job="busy"), 1,
        [(dict(namespace="ml", job="train"), "Training job ml/train makes no progress.",
          "No rank of job train received a batch in the last 5m, while their hooks still report: "
          "the job hangs (a dead or stuck mount under a loader, a worker blocked in the kernel, "
          "a collective waiting for a rank that never comes).")]),
    "StallscopeAgentDown": (
        [(sel("up", **AGENT), "0+0x40"), (sel("up", job="stallscope", instance="10.0.0.2:9478"), "1+0x40"),
         (sel("up", job="node-exporter", instance="10.0.0.1:9100"), "0+0x40")], 0,
        [(dict(AGENT), "A stallscope agent is down.",
          "Prometheus has not scraped the stallscope agent at 10.0.0.1:9478 for 5m: data-wait and node "
          "signals of the ranks on that node are missing.")]),
    "StallscopeRankSilent": (
        [(sel("stallscope_step_seconds_count", **dict(POD0, rank="0")), "0+600x10 stale"),
         (sel("stallscope_step_seconds_count", **dict(POD0, rank="1", pod="train-1")), "0+600x40"),
         (sel("stallscope_step_seconds_count", **dict(POD0, job="done", rank="0", pod="done-0")),
          "0+600x10 stale")], 11,
        [(dict(namespace="ml", job="train", rank="0", pod="train-0", node="n1"),
          "Rank 0 of job ml/train stopped reporting.",
          "The hook of rank 0 (pod train-0 on node n1) reported within the last 1h but not now, while "
          "other ranks of job train still report: the process died or hangs, or it lost the agent's "
          "socket.")]),
    # A worker's death: the pod's counter rises at minute 10; one that stands still
    # (train-1) and reason "other" (train-0) do not page.
    "StallscopeLoaderWorkerKilled": (
        [(sel("stallscope_loader_worker_exits_total", **pod_labels("train-0", reason="memory_limit")),
          "0x9 1+0x30"),
         (sel("stallscope_loader_worker_exits_total", **pod_labels("train-0", reason="other")), "0+1x40"),
         (sel("stallscope_loader_worker_exits_total", **pod_labels("train-1", reason="shm_exhaustion")),
          "1+0x40")], 10,
        [(pod_labels("train-0", reason="memory_limit"),
          "A DataLoader worker of pod ml/train-0 died (memory_limit).",
          "A loader worker of %s ended by a signal within the last 5m; the agent's evidence says "
          "memory_limit (shm_exhaustion: /dev/shm was full; memory_limit: the OOM killer of the pod's "
          "memory cgroup; native_crash: a crash in native code; killed: another SIGKILL). `stallscope "
          "diagnose train-0 -n ml` names the worker, its last RSS and the limit." % WHERE0)]),
    # The loader's own error (issue 32): train-0's counter rises at minute 10; "other"
    # (train-0) and a count that stands still (train-1) do not page.
    "StallscopeLoaderError": (
        [(sel("stallscope_loader_errors_total", **pod_labels("train-0", cause="shm_exhaustion")),
          "0x9 1+0x30"),
         (sel("stallscope_loader_errors_total", **pod_labels("train-0", cause="other")), "0+1x40"),
         (sel("stallscope_loader_errors_total", **pod_labels("train-1", cause="shm_exhaustion")),
          "1+0x40")], 10,
        [(pod_labels("train-0", cause="shm_exhaustion"),
          "The DataLoader of pod ml/train-0 raised (shm_exhaustion).",
          "A trainer of %s stopped within the last 5m on its DataLoader's own error, which names "
          "shm_exhaustion (shm_exhaustion: a worker could not allocate a batch in /dev/shm). "
          "`stallscope diagnose train-0 -n ml` shows the error and the /dev/shm size that would "
          "have been enough." % WHERE0)]),
    # Every rank of job train stopped reporting at minute 10 while its two pods run and
    # its agent is up; job done's pod finished (phase Running 0); job half still has a
    # rank reporting (StallscopeRankSilent's case, not this one).
    "StallscopeJobNotWatched": (
        # (rank 1 steps slower: topk(1) names rank 0's pod, the one with the most steps)
        [(sel("stallscope_step_seconds_count", **dict(POD0, rank=str(r), pod="train-%d" % r)),
          "0+%dx10 stale" % (600 - 300 * r)) for r in (0, 1)]
        + [(sel("stallscope_step_seconds_count", **dict(POD0, job="done", rank="0", pod="done-0")),
            "0+600x10 stale"),
           (sel("stallscope_step_seconds_count", **dict(POD0, job="half", rank="0", pod="half-0")),
            "0+600x10 stale"),
           (sel("stallscope_step_seconds_count", **dict(POD0, job="half", rank="1", pod="half-1")),
            "0+600x40"),
           (sel("up", **AGENT), "1+0x40")]
        + [(sel("kube_pod_status_phase", job="kube-state-metrics", namespace="ml", pod=p, phase="Running"),
            "1+0x40") for p in ("train-0", "train-1", "half-0", "half-1")]
        + [(sel("kube_pod_status_phase", job="kube-state-metrics", namespace="ml", pod="done-0",
                phase="Running"), "1x10 0x30")], 11,
        [(dict(namespace="ml", job="train"),
          "No rank of job ml/train reports while its pods run.",
          "The hooks of job train reported within the last 1h and none reports now, while 2 of its "
          "pods still run (kube_pod_status_phase), e.g. pod train-0 on node n1, and the agents that "
          "carried their series are up: the training loop stopped being watched (a framework upgrade "
          "that no longer calls the wrapped loader, the hook turned off, the agent's socket not "
          "mounted into a restarted pod). Every other stallscope alert about this job is silent "
          "until it reports again.")]),
    # The agent at 10.0.0.1 is scraped without honor_labels (its training labels renamed
    # exported_*); the one at 10.0.0.2 keeps them.
    "StallscopeHonorLabelsMissing": (
        [(sel("stallscope_step_seconds_count", exported_job="train", exported_namespace="ml", pod="train-0",
              rank="0", node="n1", **AGENT), "0+600x40"),
         (sel("stallscope_step_seconds_count", exported_job="train", exported_namespace="ml", pod="train-1",
              rank="1", node="n1", **AGENT), "0+600x40"),
         (sel("stallscope_step_seconds_count", **dict(POD0, rank="2", pod="train-2",
                                                       instance="10.0.0.2:9478")), "0+600x40"),
         (sel("up", **AGENT), "1+0x40"),
         (sel("up", job="stallscope", instance="10.0.0.2:9478"), "1+0x40")], 0,
        [(dict(AGENT), "The stallscope agent at 10.0.0.1:9478 is scraped without the training jobs' labels.",
          "2 step series the agent at 10.0.0.1:9478 serves reach Prometheus (scrape job stallscope) "
          "without their training job's namespace and job: the scrape lacks `honor_labels: true`, so "
          "Prometheus renamed them exported_job and exported_namespace. No SLI, burn-rate or cause "
          "alert matches them: every job on that node goes unwatched.")]),
    "StallscopeExporterFailing": (
        [(sel("stallscope_exporter_success", exporter="fuse", **AGENT), "0+0x40"),
         (sel("stallscope_exporter_success", exporter="psi", **AGENT), "1+0x40")], 0,
        [(dict(AGENT, exporter="fuse"), "A stallscope exporter keeps failing.",
          "Exporter fuse of the agent at 10.0.0.1:9478 has failed every collection for 5m: the signal "
          "it reads is missing from dashboards, alerts and diagnose.")]),
    "StallscopeHookDroppingEvents": (
        [(sel("stallscope_hook_dropped_events_total", **dict(POD0, rank="0")), "1000+30x40"),
         (sel("stallscope_hook_dropped_events_total", **dict(POD0, rank="1", pod="train-1")),
          "1000+0x40")], 1,
        [(dict(namespace="ml", job="train", rank="0", pod="train-0", node="n1"),
          "The hook of rank 0 of job ml/train drops events.",
          "The hook of rank 0 (pod train-0 on node n1) could not deliver 0.50 batch events per second "
          "to the agent over the last 5m: its data-wait figures undercount.")]),
}


def _minutes(duration):
    m = re.fullmatch(r"(\d+)(m|h|d)", duration)
    assert m, "test cases assume `for:` and windows in whole minutes, hours or days, got %r" % duration
    return int(m.group(1)) * {"m": 1, "h": 60, "d": 1440}[m.group(2)]


# -- input goodput's burn-rate alerts: cases derived from the config's SLO block ---------
SLO = config.DEFAULT.slo
BURNS = {b.alert: b for b in SLO.burns}
# just over and just under a burn rate: the worst rank's wait share at (1 +- MARGIN) x
# factor x budget
MARGIN = 0.05


def burn_ranks(share, minutes, job="train"):
    """A job of two ranks whose worst (rank 0) waits ``share`` of its step time throughout
    (rank 1 a tenth of that): its SLI is 1 - share over every window from minute 1 on."""
    return rank(0, 60 * share, job=job, minutes=minutes) + rank(1, 6 * share, job=job, minutes=minutes)


def burn_case(b):
    """(series, t_true, expected) of burn-rate alert ``b``: the worst rank's share just over
    its factor x budget from the start (every window's burn rate is share / budget from
    minute 1 on); a second job just under it must not fire."""
    over, under = b.factor * SLO.budget * (1 + MARGIN), b.factor * SLO.budget * (1 - MARGIN)
    minutes = _minutes(b.for_) + 10
    burn = over / SLO.budget
    left = 1 - burn
    page = b.severity == "critical"
    description = (
        "Job train spent its input-goodput error budget at %.3gx the allowed pace over the last %s and "
        "at %.3gx over the last %s (this alert: over %sx in both; input goodput is 1 - the slowest "
        "rank's share of step time blocked in next(loader), its error budget %s of step time). %s of the "
        "budget over the last %s is left. In synchronous training every rank runs at the slowest's "
        "pace: the slowest is rank 0 (pod train-0 on node n1); run `stallscope diagnose train-0 -n ml`."
        % (burn, b.long, burn, b.short, promql.num(b.factor), humanize_percentage(SLO.budget),
           humanize_percentage(left), SLO.period))
    return (burn_ranks(over, minutes) + burn_ranks(under, minutes, job="under"), 1,
            [(dict(namespace="ml", job="train"),
              "Training job ml/train spends its input-goodput error budget at %sx the pace its SLO "
              "allows%s." % (promql.num(b.factor), "" if page else " (a ticket)"), description)])


CASES.update({name: burn_case(b) for name, b in BURNS.items()})


ALERTS = {a.name: a for a in alerts.all_alerts(config.DEFAULT)}


def case(name):
    """(series, t_true, expected) of alert ``name``: its hand-written entry, else derived
    from the vocabulary (CannotDerive where it cannot be)."""
    if name in CASES:
        return CASES[name]
    c = cause_case(config.DEFAULT, name)
    return c.series, c.t_true, c.expected


def why_not_derivable(name):
    """None when the case of alert ``name`` derives from the vocabulary, else why not."""
    try:
        cause_case(config.DEFAULT, name)
    except CannotDerive as e:
        return str(e)
    return None


def derivable(name):
    return why_not_derivable(name) is None


DERIVED = sorted(n for n in ALERTS if n not in CASES and derivable(n))


def unit_test(name, tmp_path, before=-1, after=0, rule_files=None):
    """Write and run a promtool test for alert ``name``; returns (returncode, output)."""
    series, t_true, expected = case(name)
    alert = ALERTS[name]
    fire = t_true + _minutes(alert.for_)
    exp = [{"exp_labels": dict(labels, severity=alert.severity),
            "exp_annotations": {"summary": summary, "description": description,
                                "runbook_url": RUNBOOKS + name + ".md"}}
           for labels, summary, description in expected]
    doc = {"rule_files": rule_files or RULE_FILES, "evaluation_interval": "1m", "group_eval_order": GROUPS,
           "tests": [{"interval": "1m",
                      "input_series": [{"series": s, "values": v} for s, v in series],
                      "alert_rule_test": [
                          {"eval_time": "%dm" % (fire + before), "alertname": name, "exp_alerts": []},
                          {"eval_time": "%dm" % (fire + after), "alertname": name, "exp_alerts": exp}]}]}
    path = tmp_path / ("%s.test.yaml" % name)
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_promtool_check_rules(tmp_path):
    r = subprocess.run(["promtool", "check", "rules", *RULE_FILES], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: %d rules found" % SLI_RULES in r.stdout
    assert "SUCCESS: %d rules found" % len(ALERTS) in r.stdout
    # the PrometheusRule manifest carries the same groups: check its spec as a rule file
    text = open(os.path.join(ROOT, "deploy", "kubernetes", "base", "prometheusrule.yaml")).read()
    spec = text.split("\nspec:\n", 1)[1]
    groups = tmp_path / "spec.yaml"
    groups.write_text("".join(line[2:] + "\n" for line in spec.splitlines()))
    r = subprocess.run(["promtool", "check", "rules", str(groups)], capture_output=True, text=True)
    found = "SUCCESS: %d rules found" % (SLI_RULES + len(ALERTS))
    assert r.returncode == 0 and found in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_unit_test():
    """Derived or hand-written, never neither; and hand-written only where it cannot be
    derived (a CASES entry would otherwise hide the vocabulary's line)."""
    # a cause alert whose case cannot be derived says why: fix the derivation
    # (tests/helpers/alertcases.py) or the vocabulary's entry, not a hand-written case
    cause_alerts = set(vocabulary.cause_alerts())
    underived = {n: why_not_derivable(n) for n in sorted(cause_alerts - set(CASES) - set(DERIVED))}
    assert underived == {}, "cause alerts whose promtool case cannot be derived: %s" % "; ".join(
        "%s: %s" % kv for kv in underived.items())
    assert sorted(set(ALERTS) - cause_alerts - set(CASES)) == [], "no case: write one in CASES"
    assert sorted(set(CASES) - set(ALERTS)) == [], "a case for an alert that does not exist"
    assert sorted(n for n in CASES if derivable(n)) == [], "derived from the vocabulary: drop it from CASES"
    # the cause alerts without a hand-written case are the derived ones
    assert DERIVED == sorted(set(vocabulary.cause_alerts()) - set(CASES)) != []


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_fires_at_its_for_boundary_with_its_labels_and_annotations(name, tmp_path):
    code, out = unit_test(name, tmp_path)
    assert code == 0, out


def _mutated(tmp_path, name, change):
    """alerts.yaml with ``change`` applied to alert ``name``'s rule only."""
    text = open(RULE_FILES[1]).read()
    head, sep, rule = text.partition("      - alert: %s\n" % name)
    assert sep, name
    rule, sep2, tail = rule.partition("\n      - alert: ")
    changed = change(rule)
    assert changed != rule, "the mutation changed nothing in %s" % name
    path = tmp_path / "alerts.yaml"
    path.write_text(head + sep + changed + sep2 + tail)
    return [RULE_FILES[0], str(path)]


@pytest.mark.parametrize("name", DERIVED)
def test_a_derived_case_fails_when_the_rules_move_its_line_or_for(name, tmp_path):
    """The derived case tests the vocabulary's line and the config's ``for:``, not
    whatever the rule file says: a threshold moved past either side of the signal
    (just past / just before the line), or a ``for:`` a minute longer or shorter, in a
    scratch copy of the generated rules fails it."""
    _cause, a = vocabulary.cause_alerts()[name]
    line = config.DEFAULT.line(name)
    step = 0.04 * (abs(line) or 1.0)
    cmp = "%s %s" % (a.op, promql.num(line))
    moves = {"line up": "%s %s" % (a.op, promql.num(line + step)),
             "line down": "%s %s" % (a.op, promql.num(line - step))}
    if a.op == "==":  # an equality has no side to move to: compare with another value
        moves = {"line elsewhere": "%s %s" % (a.op, promql.num(line + 1))}
    minutes = _minutes(config.DEFAULT.cause_for)
    fors = {"for longer": "%dm" % (minutes + 1), "for shorter": "%dm" % (minutes - 1)}
    cmp_line = re.compile(r"(\n +)%s\n" % re.escape(cmp))
    changes = {what: (lambda r, new=new: cmp_line.sub(lambda m: "%s%s\n" % (m.group(1), new), r))
               for what, new in moves.items()}
    changes.update({what: (lambda r, new=new: r.replace("for: %s\n" % config.DEFAULT.cause_for,
                                                        "for: %s\n" % new))
                    for what, new in fors.items()})
    failed = {what: unit_test(name, tmp_path, rule_files=_mutated(tmp_path, name, change))[0] != 0
              for what, change in changes.items()}
    assert failed == {what: True for what in failed}


def test_a_derived_case_renders_as_prometheus_does(tmp_path, monkeypatch):
    """Cause alerts of shapes the vocabulary does not have yet, generated by the mixin and
    run by promtool against their derived cases: a line past a minute rendered with
    humanizeDuration and humanize, printf and the bare value; a byte rate through a
    negative matcher rendered with humanize1024."""
    slow = vocabulary.CauseAlert(
        "StallscopeTestProbeSlow", "fuse_probe_seconds", ">", 90.0,
        "A probe took {{ $value | humanize }}s.",
        "FUSE mount {{ $labels.mountpoint }} of <where> took {{ $value | humanizeDuration }} "
        '({{ printf "%.2f" $value }}, {{ $value }}; threshold <line>).')
    read = vocabulary.CauseAlert(
        "StallscopeTestReadFast", "test_read_bytes_rate", ">", 5e7,
        "The loader reads {{ $value | humanize }}B/s.",
        "<where> read {{ $value | humanize1024 }}B/s over the last <window> (threshold <line>).")
    monkeypatch.setitem(vocabulary.SIGNAL, "test_read_bytes_rate", vocabulary.Signal(
        "test_read_bytes_rate", "bytes_rate", ("rank",), "loaderio", "test",
        'sum by (namespace, pod) (rate(stallscope_loader_read_bytes_total{io!="block",$sel}[$w]))',
        ("namespace", "pod")))
    cause = dataclasses.replace(vocabulary.cause("fuse_unhealthy"), alerts=(slow, read))
    monkeypatch.setattr(vocabulary, "CAUSES", (cause,))
    monkeypatch.setattr(vocabulary, "cause_alerts", lambda: {a.name: (cause, a) for a in cause.alerts})
    files = generate.alert_files(config.DEFAULT)
    for f, text in files.items():
        (tmp_path / f).write_text(text)
    made = {a.name: a for a in alerts.all_alerts(config.DEFAULT)}
    for name in (slow.name, read.name):
        monkeypatch.setitem(ALERTS, name, made[name])
        code, out = unit_test(name, tmp_path, rule_files=[str(tmp_path / f) for f in files])
        assert code == 0, out
    [(_, _, text)] = case(slow.name)[2]
    assert "took 1m 31s (91.80, 91.8; threshold 90s)" in text, text


def test_a_wrong_boundary_fails(tmp_path):
    # The harness can fail: expecting the alert one evaluation early must not pass.
    code, out = unit_test("StallscopeDataWaitHigh", tmp_path, before=-2, after=-1)
    assert code != 0 and "StallscopeDataWaitHigh" in out


def test_idle_accelerators_rule_is_world_size_times_the_stragglers_share(tmp_path):
    # 4 ranks; rank 3 waits 6 s of every 60 s of steps (10 %), the others 0.6 s (1 %):
    # every rank idles while rank 3 waits, so 4 x 0.10 = 0.4 accelerators idle, 9.6
    # GPU-hours a day, attributed to the best-scored cause of the job
    series = rank(0, 0.6) + rank(1, 0.6) + rank(2, 0.6) + rank(3, 6) + rank(0, 0.6, job="calm")
    score = dict(POD0, pod="train-3", rank="3")
    series += [(sel("stallscope_stall_cause_score", cause="too_few_workers", **score), "0.8x40"),
               (sel("stallscope_stall_cause_score", cause="cpu_throttle", **score), "0.3x40")]
    n = promql.names(config.DEFAULT)
    doc = {"rule_files": RULE_FILES, "evaluation_interval": "1m", "group_eval_order": GROUPS,
           "tests": [{"interval": "1m",
                      "input_series": [{"series": s, "values": v} for s, v in series],
                      "promql_expr_test": [
                          {"expr": "round(%s, 1e-6)" % n["job_idle"], "eval_time": "10m", "exp_samples": [
                              {"labels": '{job="train", namespace="ml"}', "value": 0.4},
                              {"labels": '{job="calm", namespace="ml"}', "value": 0.01}]},
                          {"expr": "round(%s * 24, 1e-6)" % n["job_idle"], "eval_time": "10m",
                           "exp_samples": [
                              {"labels": '{job="train", namespace="ml"}', "value": 9.6},
                              {"labels": '{job="calm", namespace="ml"}', "value": 0.24}]},
                          {"expr": "round(%s, 1e-6)" % n["job_idle_cause"], "eval_time": "10m",
                           "exp_samples": [{"labels": '{cause="too_few_workers", job="train", '
                                                      'namespace="ml"}', "value": 0.4}]}]}]}
    path = tmp_path / "idle.test.yaml"
    path.write_text(json.dumps(doc, indent=1))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # the harness can fail: a wrong world size must not pass
    doc["tests"][0]["promql_expr_test"][0]["exp_samples"][0]["value"] = 0.1
    path.write_text(json.dumps(doc, indent=1))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def test_a_window_without_a_batch_has_no_ratio_rather_than_nan(tmp_path):
    """A rank whose counters stop (start-up before its first batch, a hang) has no data-wait
    ratio over a window without a batch: 0/0 was NaN, and one NaN made the job's
    avg_over_time, and its lost hours in `stallscope top`, NaN (CI: top sorted the slowed
    job last)."""
    labels = dict(POD0, rank="0")
    # 10 % waiting for 10 minutes, then no batch at all for 10 more
    series = [(sel("stallscope_data_wait_seconds_sum", **labels), "0+6x10 60x10"),
              (sel("stallscope_step_seconds_sum", **labels), "0+60x10 600x10"),
              (sel("stallscope_step_seconds_count", **labels), "0+600x10 6000x10")]
    n = promql.names(config.DEFAULT)
    ranked = '{job="train", namespace="ml", node="n1", pod="train-0", rank="0"}'  # round() drops the name
    doc = {"rule_files": RULE_FILES, "evaluation_interval": "1m", "group_eval_order": GROUPS,
           "tests": [{"interval": "1m",
                      "input_series": [{"series": s, "values": v} for s, v in series],
                      "promql_expr_test": [
                          {"expr": "round(%s, 1e-6)" % n["rank_ratio"], "eval_time": "8m",
                           "exp_samples": [{"labels": ranked, "value": 0.1}]},
                          {"expr": n["rank_ratio"], "eval_time": "18m", "exp_samples": []},
                          {"expr": "round(avg_over_time(%s[20m]), 1e-6)" % n["rank_ratio"],
                           "eval_time": "19m", "exp_samples": [{"labels": ranked, "value": 0.1}]}]}]}
    path = tmp_path / "nobatch.test.yaml"
    path.write_text(json.dumps(doc, indent=1))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_priced_config_records_the_cost_per_day():
    cfg = config.load(gpu_hour_price=2.5)
    priced = {r["record"]: r["expr"] for r in rules.recording_rules(cfg)}
    name = promql.names(cfg)["job_idle_cost"]
    assert priced[name].endswith("* 24 * 2.5")
    assert name not in {r["record"] for r in rules.recording_rules(config.DEFAULT)}


def _step(b):
    """Minutes between evaluations in a burn alert's window tests: 10 for windows of days
    (4,700 evaluations of a 3-day window at 1m took a minute of CI; at 10m the windows
    hold 433 samples and the `for:` of hours 18 evaluations), else 1."""
    return 10 if _minutes(b.long) >= 1440 else 1


def _at(t, step):
    """Minute ``t`` rounded up to an evaluation."""
    return -(-t // step) * step


def _promtool(tmp_path, name, series, alert_tests=(), expr_tests=(), rule_files=None, step=1):
    doc = {"rule_files": rule_files or RULE_FILES, "evaluation_interval": "%dm" % step,
           "group_eval_order": GROUPS,
           "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                      "alert_rule_test": list(alert_tests), "promql_expr_test": list(expr_tests)}]}
    path = tmp_path / ("%s.test.yaml" % name)
    path.write_text(json.dumps(doc, indent=1))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def _over(record, factor, t):
    """An expression test: ``record`` of job train is over ``factor`` at minute ``t``."""
    return {"expr": "%s > bool %s" % (record, promql.num(factor)), "eval_time": "%dm" % t,
            "exp_samples": [{"labels": '{job="train", namespace="ml"}', "value": 1}]}


def _firing(name, t):
    """An expression test: alert ``name`` fires for job train at minute ``t`` (its labels
    and annotations are the burn case's business)."""
    return {"expr": 'count by (job, severity) (ALERTS{alertname="%s", alertstate="firing"})' % name,
            "eval_time": "%dm" % t,
            "exp_samples": [{"labels": '{job="train", severity="%s"}' % BURNS[name].severity, "value": 1}]}


def _under(record, factor, t):
    return dict(_over(record, factor, t),
                exp_samples=[{"labels": '{job="train", namespace="ml"}', "value": 0}])


def _stall(share_before, minutes_before, share, minutes, share_after=0.0, minutes_after=0):
    """Rank 0 of job train waits ``share_before`` of its step time, then ``share``, then
    ``share_after`` (each for that many minutes); rank 1 never waits."""
    labels = dict(job="train", rank="0", pod="train-0", namespace="ml", node="n1", instance="10.0.0.1:9478")
    total = minutes_before + minutes + minutes_after
    parts, at = [], 0.0
    for s, m in ((share_before, minutes_before), (share, minutes), (share_after, minutes_after)):
        if m:
            parts.append("%s+%gx%d" % (promql.num(round(at, 6)), 60 * s, m))
            at += 60 * s * m
    series = [(sel("stallscope_data_wait_seconds_sum", **labels), _chain(parts)),
              (sel("stallscope_step_seconds_sum", **labels), "0+60x%d" % total),
              (sel("stallscope_step_seconds_count", **labels), "0+600x%d" % total)]
    return series + rank(1, 0, minutes=total)


def _chain(parts):
    """Expanding notation pieces back to back: "a+bxn" then the next piece's start is the
    previous value plus its step (promtool repeats a piece n+1 times: its start and n steps)."""
    out, value = [], 0.0
    for p in parts:
        start, rest = p.split("+", 1)
        step, n = rest.split("x")
        out.append("%s+%sx%d" % (promql.num(round(value, 6)), step, int(n) - 1))
        value += float(step) * int(n)
    return " ".join(out)


@pytest.mark.parametrize("name", sorted(BURNS))
def test_the_short_window_resets_a_burn_alert_the_long_one_still_holds(name, tmp_path):
    """A stall at 1.5x the burn rate for a whole long window pages; once it ends, the short
    window falls under the factor within short + the rate window + a minute while the long
    one still holds over it, and the alert no longer fires (the short window gates the
    long: it resets soon after the stall ends)."""
    b = BURNS[name]
    long_, short, step = _minutes(b.long), _minutes(b.short), _step(b)
    share = 1.5 * b.factor * SLO.budget
    after = short + 6 + 5 + step
    end = _at(long_ + 1, step)  # the stall's last sample is at long_ + 1
    series = _stall(0.0, 1, share, long_, 0.0, after)
    burn = promql.slo_names(config.DEFAULT)
    reset = _at(long_ + 1 + short + _minutes(config.DEFAULT.rate_window) + 1, step)
    code, out = _promtool(tmp_path, name, series, step=step, alert_tests=[
        {"eval_time": "%dm" % reset, "alertname": name, "exp_alerts": []}],
        expr_tests=[_firing(name, end), _over(burn["burn_" + b.long], b.factor, reset),
                    _under(burn["burn_" + b.short], b.factor, reset)])
    assert code == 0, out


@pytest.mark.parametrize("name", sorted(BURNS))
def test_a_short_spike_the_long_window_does_not_hold_pages_nobody(name, tmp_path):
    """After a healthy long window, the worst rank waits all the time (50x the burn rate) for
    long enough that the short window is over the factor, and short enough that the long
    one stays near half of it; then it is healthy again: nothing fires, through the
    alert's `for:` (the long window gates the short). The same spike held until the long
    window reaches the factor does fire: the case can fail."""
    b = BURNS[name]
    long_, short, step = _minutes(b.long), _minutes(b.short), _step(b)
    ramp = _minutes(config.DEFAULT.rate_window)
    spike = max(int(long_ * b.factor * SLO.budget * 0.5), int(short * b.factor * SLO.budget * 2) + ramp + 1)
    burn = promql.slo_names(config.DEFAULT)
    for_ = _minutes(b.for_)
    series = _stall(0.0, long_ + 1, 1.0, spike, 0.0, for_ + 2 + step)
    t = _at(long_ + 1 + spike, step)
    code, out = _promtool(tmp_path, name, series, step=step, alert_tests=[
        {"eval_time": "%dm" % (t + m), "alertname": name, "exp_alerts": []} for m in (0, for_)],
        expr_tests=[_over(burn["burn_" + b.short], b.factor, t), _under(burn["burn_" + b.long], b.factor, t)])
    assert code == 0, out
    # held on: the long window's burn crosses the factor after long x factor x budget
    # minutes of it (+ the rate window's ramp), and the alert fires `for:` later
    crossing = int(long_ * b.factor * SLO.budget) + _minutes(config.DEFAULT.rate_window) + 2
    series = _stall(0.0, long_ + 1, 1.0, crossing + for_ + step + 1)
    code, out = _promtool(tmp_path, name + "-held", series, step=step,
                          expr_tests=[_firing(name, _at(long_ + 1 + crossing + for_, step))])
    assert code == 0, out


@pytest.mark.parametrize("name", sorted(BURNS))
def test_a_burn_case_fails_when_the_rules_move_its_factor_or_for(name, tmp_path):
    """The burn case tests the config's factor and `for:`: a factor moved past the
    injected share (MARGIN either side), or a `for:` a minute longer or shorter, in a
    scratch copy of the generated rules fails it."""
    b = BURNS[name]
    minutes = _minutes(b.for_)
    cmp = "> %s\n" % promql.num(b.factor)
    changes = {
        "factor up": lambda r: r.replace(cmp, "> %s\n" % promql.num(round(b.factor * (1 + 2 * MARGIN), 6))),
        "factor down": lambda r: r.replace(cmp, "> %s\n" % promql.num(round(b.factor * (1 - 2 * MARGIN), 6))),
        "for longer": lambda r: r.replace("for: %s\n" % b.for_, "for: %dm\n" % (minutes + 1)),
        "for shorter": lambda r: r.replace("for: %s\n" % b.for_, "for: %dm\n" % (minutes - 1)),
    }
    # a lower factor also fires the job just under it: the expected alerts differ
    failed = {what: unit_test(name, tmp_path, rule_files=_mutated(tmp_path, name, change))[0] != 0
              for what, change in changes.items()}
    assert failed == {what: True for what in changes}


def test_slo_records_are_the_worst_ranks_share_against_the_budget(tmp_path):
    """At a constant worst-rank share of 10 % (rank 1 at 1 %): input goodput 0.9 over every
    window, burn rate 5 (10 % / the 2 % budget), the budget 0.02 and the budget left over
    the period 1 - 5 = -4. A job a config gives an 85 % target (budget 15 %) burns at 2/3
    and its 10 % opens no StallscopeDataWaitHigh ticket; another job's does."""
    n = promql.slo_names(config.DEFAULT)
    job = '{job="train", namespace="ml"}'
    series = rank(0, 6, minutes=70) + rank(1, 0.6, minutes=70)
    tests = [{"expr": "round(%s, 1e-6)" % n["budget"], "eval_time": "65m",
              "exp_samples": [{"labels": job, "value": 0.02}]},
             {"expr": "round(%s, 1e-6)" % n["budget_left"], "eval_time": "65m",
              "exp_samples": [{"labels": job, "value": -4}]}]
    for w in SLO.windows():
        tests.append({"expr": "round(%s, 1e-6)" % n["sli_" + w], "eval_time": "65m",
                      "exp_samples": [{"labels": job, "value": 0.9}]})
        tests.append({"expr": "round(%s, 1e-6)" % n["burn_" + w], "eval_time": "65m",
                      "exp_samples": [{"labels": job, "value": 5}]})
    code, out = _promtool(tmp_path, "records", series, expr_tests=tests)
    assert code == 0, out
    # per-job target by config: ml/train at 95 % (budget 5 %), every other job the default
    cfg = config.load(slo={"targets": {"ml/train": 0.85}})
    rules_dir = tmp_path / "override"
    rule_files = generate.write(generate.alert_files(cfg), str(rules_dir))
    series += rank(0, 6, job="other", minutes=70)
    code, out = _promtool(tmp_path, "override", series, rule_files=rule_files, expr_tests=[
        {"expr": "round(%s, 1e-6)" % n["burn_1h"], "eval_time": "65m",
         "exp_samples": [{"labels": job, "value": 0.666667},
                         {"labels": '{job="other", namespace="ml"}', "value": 5}]},
        {"expr": 'count by (job) (ALERTS{alertname="StallscopeDataWaitHigh", alertstate="firing"})',
         "eval_time": "30m", "exp_samples": [{"labels": '{job="other"}', "value": 1}]}])
    assert code == 0, out
