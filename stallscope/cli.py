"""The ``stallscope`` command: parses and dispatches, nothing more."""
import os
import sys

import click

from .agent import options as agent_options


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stallscope")
def main():
    """stallscope: are the GPUs waiting on the input pipeline, on which rank, and why?

    In the trainer: `import stallscope` and `loader = stallscope.watch(loader)`.
    On each GPU node: `stallscope agent`. When paged: `stallscope diagnose POD`.
    """


@main.command()
@agent_options.add_options
def agent(**kwargs):
    """Run the node agent: receive hook reports, read node signals, serve /metrics.

    \b
    Endpoints:
      /metrics            Prometheus exposition (scrape with honor_labels: true, since
                          per-rank series carry the training job's `job` label)
      /healthz            liveness
      /api/v1/ranks       live ranks on this node (JSON)
      /api/v1/timeline    ?rank=R[&job=J][&pod=P][&seconds=S] batch events (JSON)
      /api/v1/diagnosis   ?pod=P | rank=R[&job=J][&seconds=S] the correlator's verdict,
                          ranked causes with evidence, the straggler on this node (JSON)
    Stops cleanly on SIGTERM.
    """
    from .agent.main import run

    sys.exit(run(agent_options.config_from(kwargs)))


_CONFIG_HELP = ("JSON object overriding fields of the mixin config (selectors, thresholds, "
                "windows, runbook_base_url); see stallscope/mixin/config.py.")


@main.command()
@click.option("--out", required=True, metavar="DIR", help="Directory for rules.yaml and alerts.yaml.")
@click.option("--prometheusrule", metavar="FILE",
              help="Also write the same groups as a Prometheus Operator PrometheusRule manifest.")
@click.option("--inhibit-rules", "inhibit_rules", metavar="FILE",
              help="Also write Alertmanager inhibit_rules: a burn-rate page mutes its job's tickets.")
@click.option("--alertmanagerconfig", metavar="FILE",
              help="Also write the same inhibition as a Prometheus Operator AlertmanagerConfig.")
@click.option("--config", "config_path", metavar="FILE", help=_CONFIG_HELP)
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 and show a diff where the files differ from the generator.")
def alerts(out, prometheusrule, inhibit_rules, alertmanagerconfig, config_path, check):
    """Generate the Prometheus recording rules and alerts (with runbook_url annotations).

    \b
    Files:
      DIR/rules.yaml    recording rules for the data-wait SLI (per rank; max and median per job)
                        and input goodput as an SLO (SLI, burn rate, budget left per job)
      DIR/alerts.yaml   the burn-rate pages and ticket (StallscopeInputGoodput*Burn), the 2 %
                        line's ticket StallscopeDataWaitHigh, StallscopeStragglerRank, the cause
                        alerts (throttling, pressure, /dev/shm, FUSE, shard reads, cache) and
                        self-health; each has a runbook in runbooks/<AlertName>.md
    Load both files with `rule_files:`; check them with `promtool check rules`.
    """
    from .mixin import commands

    sys.exit(commands.alerts(out, prometheusrule, config_path, check, inhibit_rules=inhibit_rules,
                             alertmanagerconfig=alertmanagerconfig))


@main.command()
@click.option("--out", required=True, metavar="DIR", help="Directory for the dashboard JSON files.")
@click.option("--config", "config_path", metavar="FILE", help=_CONFIG_HELP)
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 and show a diff where the files differ from the generator.")
def dashboards(out, config_path, check):
    """Generate the Grafana dashboards (job overview; node and pod drill-down).

    Import the JSON files into Grafana (or provision them); they need the recording rules
    from `stallscope alerts` loaded into the Prometheus they query.
    """
    from .mixin import commands

    sys.exit(commands.dashboards(out, config_path, check))


@main.command()
@click.argument("pod")
@click.option("-n", "--namespace", default=None,
              help="The pod's namespace (needed only when the name is in several).")
@click.option("--prometheus", "prometheus_url", envvar="STALLSCOPE_PROMETHEUS_URL", metavar="URL",
              help="Prometheus that scrapes the agents [env STALLSCOPE_PROMETHEUS_URL].")
@click.option("--agent", "agent_url", metavar="URL", multiple=True,
              help="The node agent to ask (default: found from its own metrics in Prometheus). "
                   "Repeat it, one per node, to judge a rank against its job's ranks on every "
                   "node without Prometheus.")
@click.option("--window", default="15m", show_default=True, metavar="DURATION",
              help="How far back to look: 90s, 15m, 1h.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.option("--stacks", is_flag=True,
              help="Also sample the rank's main process and loader workers with py-spy "
                   "(run on the pod's node; needs ptrace).")
@click.option("--plot", metavar="FILE.png", help="Write a PNG of data-wait against GPU busy (matplotlib).")
@click.option("--at", "at", metavar="TIME", default=None,
              help="Diagnose the window ending at TIME, after the fact (RFC 3339, unix seconds, or "
                   "relative: -6h), from Prometheus; the agent is asked only while its timeline "
                   "still holds TIME.")
@click.option("--alert", "alert", metavar="NAME", default=None,
              help="Diagnose the window centred on the start of the last NAME alert about the pod "
                   "or its job (ALERTS_FOR_STATE in Prometheus), e.g. StallscopeDataWaitHigh.")
def diagnose(pod, namespace, prometheus_url, agent_url, window, as_json, stacks, plot, at, alert):
    """Why does POD's rank wait on its input pipeline? From the page to the cause.

    \b
    1. Cluster view (Prometheus): the pod's job, rank and node; its data-wait ratio
       against the job's max and median; the slowest ranks; since when.
    2. Node detail (the node's agent, found in Prometheus or given with --agent): the
       correlator's verdict, causes ranked with evidence, loader settings, the worker
       count that keeps up. With --agent alone it works without Prometheus; with one
       --agent per node of the job, the rank is judged against the whole job.
    3. --stacks: py-spy dumps of the main process and each worker, classified as
       fetch, decode, collate, ipc_wait or idle. py-spy: $STALLSCOPE_PY_SPY, PATH, or
       next to this Python (pip install 'stallscope[stacks]').
    4. The report: verdict, evidence table, causes, next steps (runbooks/<Alert>.md)
       and commands for a deeper look; --json for automation; --plot for a timeline.

    \b
    Verdicts: healthy, input_bound (waits on its own loader), not_input_bound (waits
    for a straggler elsewhere, which is named), unknown.
    Exit codes: 0 no stall found; 1 a stall found (input_bound, or not_input_bound:
    the job waits on a straggler); 2 could not diagnose (one line on stderr saying why).
    An unreachable agent, missing py-spy or denied ptrace degrade the report (a note
    says so) instead of failing it.
    """
    from .diagnose.cli import main as run_diagnose

    try:
        when = _instant(at) if at is not None else None
    except ValueError as e:
        click.echo("stallscope diagnose: %s" % e, err=True)
        sys.exit(2)
    sys.exit(run_diagnose(pod, namespace=namespace, prometheus_url=prometheus_url,
                          agent_url=agent_url, window=window, as_json=as_json, stacks=stacks,
                          plot=plot, at=when, alert=alert))


@main.command()
@click.option("--prometheus", "prometheus_url", envvar="STALLSCOPE_PROMETHEUS_URL", metavar="URL",
              required=True, help="Prometheus that scrapes the agents [env STALLSCOPE_PROMETHEUS_URL].")
@click.option("--since", default="24h", show_default=True, metavar="DURATION",
              help="The period, back from --to: 90m, 24h, 7d.")
@click.option("--to", default=None, metavar="TIME",
              help="The period's end (default now): RFC 3339, unix seconds, -1h; with "
                   "`report --job J --since D --to TIME`, the same period.")
@click.option("-n", "--namespace", default=None, help="Only the jobs of this namespace.")
@click.option("--config", "config_path", metavar="FILE", help=_CONFIG_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the list as one JSON document.")
def top(prometheus_url, since, to, namespace, config_path, as_json):
    """The cluster's jobs ranked by accelerator-hours lost to input wait over a period.

    From Prometheus alone (the recording rules of `stallscope alerts`): per job, the
    accelerator-hours its ranks ran and those they idled on input wait, the cause those
    hours went to, its worst rank with its pod and node, and the cost at the config's
    gpu_hour_price. Exit 0; 2 with one line on stderr when it cannot answer.
    """
    import time as _time

    from .diagnose import window as durations
    from .fleet import top as top_mod
    from .mixin import config

    prefix = "stallscope top: "
    try:
        seconds = durations.parse(since)
        cfg = config.load(config_path)
        from .diagnose.prom import Prometheus
        now = _time.time()
        end = _instant(to) if to else now
        if end > now + 60:
            raise ValueError("the period ends in the future")
        rows = top_mod.top(Prometheus(prometheus_url, now=end), cfg, seconds, namespace)
    except (ValueError, top_mod.TopError) as e:
        click.echo(prefix + str(e), err=True)
        sys.exit(2)
    click.echo((top_mod.render_json if as_json else top_mod.render_text)(rows, seconds), nl=False)


def _instant(text):
    """A time: RFC 3339 (2026-12-05T03:10:00Z), unix seconds, or relative to now (-6h)."""
    import datetime
    import time as _time

    from .diagnose import window as durations

    t = str(text).strip()
    if t.startswith("-"):
        return _time.time() - durations.parse(t[1:])
    if t.startswith("+"):  # read, so that the command says it is in the future (issue 52)
        return _time.time() + durations.parse(t[1:])
    try:
        return float(t)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("bad time %r: use RFC 3339 (2026-12-05T03:10:00Z), unix seconds or -6h"
                         % text) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


@main.command()
@click.option("--job", required=True, help="The job (its `job` label, STALLSCOPE_JOB in the trainer).")
@click.option("-n", "--namespace", default=None, help="The job's namespace (when the name is in several).")
@click.option("--prometheus", "prometheus_url", envvar="STALLSCOPE_PROMETHEUS_URL", metavar="URL",
              required=True, help="Prometheus that scrapes the agents [env STALLSCOPE_PROMETHEUS_URL].")
@click.option("--since", default=None, metavar="DURATION",
              help="The period back from now: 6h, 7d (default 24h).")
@click.option("--from", "from_", default=None, metavar="TIME",
              help="The period's start: RFC 3339, unix seconds, -6h.")
@click.option("--to", default=None, metavar="TIME", help="The period's end (default now).")
@click.option("--config", "config_path", metavar="FILE", help=_CONFIG_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.option("--html", "html_out", default=None, metavar="FILE",
              help="Also write the report as one self-contained HTML page, with its timeline plot.")
def report(job, namespace, prometheus_url, since, from_, to, config_path, as_json, html_out):
    """The life of one job over a period, from Prometheus alone: wall time, ranks,
    accelerator-hours and those lost to input wait by cause, its worst periods, the
    stragglers that recurred with their nodes, the loader settings it ran with and where
    they changed. Exit 0; 2 with one line on stderr when it cannot answer."""
    import time as _time

    from .diagnose import window as durations
    from .diagnose.prom import Prometheus
    from .fleet import jobreport
    from .fleet import top as top_mod
    from .mixin import config

    prefix = "stallscope report: "
    try:
        if since and from_:
            raise ValueError("give --since or --from, not both")
        now = _time.time()
        end = _instant(to) if to else now
        start = _instant(from_) if from_ else end - durations.parse(since or "24h")
        cfg = config.load(config_path)
        doc = jobreport.report(Prometheus(prometheus_url, now=now), cfg, job, start, end, namespace)
    except (ValueError, top_mod.TopError) as e:
        click.echo(prefix + str(e), err=True)
        sys.exit(2)
    if html_out:
        if not _write_job_html(doc, cfg, html_out, prefix):
            sys.exit(2)
    click.echo((jobreport.render_json if as_json else jobreport.render_text)(doc), nl=False)


def _write_job_html(doc, cfg, path, prefix):
    """The job report's HTML page at ``path`` (the plot left out, and said, without
    matplotlib); False, after one line on stderr, when the page cannot be written."""
    import tempfile

    from .fleet import jobhtml

    note = None
    with tempfile.TemporaryDirectory(prefix="stallscope-report-") as tmp:
        try:
            png = jobhtml.plot(doc, os.path.join(tmp, "timeline.png"), cfg.data_wait_warning)
        except jobhtml.PlotError as e:
            png, note = None, str(e)
        page = jobhtml.page(doc, png, note)
    try:
        with open(path, "w") as f:
            f.write(page)
    except OSError as e:
        click.echo(prefix + "cannot write %s: %s" % (path, e.strerror or e), err=True)
        return False
    return True


def _scenario_names():
    from .lab import scenarios

    return [s.name for s in scenarios.REAL]


class _Scenario(click.ParamType):
    """The name of a scenario with a real run, checked lazily so that `stallscope --help`
    imports no lab code."""
    name = "SCENARIO"

    def convert(self, value, param, ctx):
        names = _scenario_names()
        if value not in names:
            self.fail("%r is not a scenario the lab runs; `stallscope lab list` shows them: %s" % (
                value, ", ".join(names)), param, ctx)
        return value


_RANKS = click.option("--ranks", default=None, type=click.IntRange(2, 16),
                      help="Training processes (gloo ranks) to run; the fault hits the last one "
                           "[default: the scenario's, 2 for most].")
_PROM = click.option("--prometheus/--no-prometheus", default=None,
                     help="Evaluate the generated alert rules with a local Prometheus "
                          "[default: when the prometheus binary is installed].")
_RECORD = click.option("--record", metavar="DIR", type=click.Path(file_okay=False),
                       help="Save the agent's per-rank timelines with the scenario's labels to "
                            "DIR/lab-SCENARIO.json (the correlator's evaluation format, "
                            "stallscope-trace/1), replacing an earlier recording.")


@main.group()
def lab():
    """Stall scenarios: a real multi-rank training job with one real injected fault.

    \b
    Each run starts a stallscope agent (with a clearly labelled SIMULATED GPU per rank:
    busy while the loop computes), optionally Prometheus with the generated alert rules
    (short windows), N ranks of a small CPU job (torch.distributed with gloo, so the
    ranks synchronise every step; each with a DataLoader with worker processes wrapped
    by stallscope.watch), injects the scenario's fault into the last rank, shows the
    per-rank data-wait while it runs, then compares what stallscope found with the
    known answer. Everything it creates (mounts, cgroups, namespaces, processes) is
    removed afterwards, also on Ctrl-C and SIGTERM.

    \b
    Exit codes: 0 found what was expected, 1 did not (or the run failed), 2 the machine
    lacks what the scenario needs (root, /dev/fuse, a cpu cgroup), 128+N on signal N.
    """


@lab.command("list")
def lab_list():
    """List the scenarios, their expected cause, and whether this machine can run them."""
    from .lab import commands

    sys.exit(commands.list_scenarios())


@lab.command("run")
@click.argument("scenario", type=_Scenario())
@_RANKS
@click.option("--duration", type=click.FloatRange(5, 3600), metavar="SECONDS",
              help="Measured window after all ranks started [default: the scenario's, 25 s].")
@click.option("--keep", is_flag=True,
              help="After the report, keep the job, the fault, the agent and Prometheus running "
                   "until Ctrl-C, to explore /metrics, the API and the alerts yourself.")
@_RECORD
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_PROM
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Put logs, shards and mount points here and keep them [default: a temporary "
                   "directory, removed afterwards].")
@click.option("--apply-fix", is_flag=True,
              help="Then run it again with the change diagnose predicted applied (more workers, a "
                   "larger CPU quota ...) and print predicted vs measured; exit 1 unless the stall "
                   "is gone.")
def lab_run(scenario, ranks, duration, keep, record, as_json, prometheus, workdir, apply_fix):
    """Run one SCENARIO end to end and say whether stallscope found its cause and rank."""
    from .lab import commands

    sys.exit(commands.run(scenario, ranks, duration, keep, record, as_json, prometheus, workdir,
                          apply_fix))


@lab.command("scoreboard")
@click.argument("scenarios", nargs=-1, type=_Scenario())
@_RANKS
@click.option("--duration", type=click.FloatRange(5, 3600), metavar="SECONDS",
              help="Measured window per scenario [default: each scenario's].")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@_PROM
@_RECORD
@click.option("--apply-fix", is_flag=True,
              help="Rerun each scenario with the change diagnose predicted and add a table of "
                   "predicted vs measured data-wait and step (about 3x as long).")
def lab_scoreboard(scenarios, ranks, duration, as_json, prometheus, record, apply_fix):
    """Run SCENARIOS (default: all) in sequence and print, per scenario, the expected and
    the diagnosed cause, the rank named, and whether the alerts matched. Scenarios this
    machine cannot run are listed as skipped with the reason. With --apply-fix, also
    predicted vs measured after each scenario's predicted change."""
    from .lab import commands

    sys.exit(commands.scoreboard_cmd(list(scenarios), ranks, duration, as_json, prometheus, record,
                                     apply_fix))


def _sample_classes():
    from .lab import sampler

    return list(sampler.CLASSES) + ["all"]


@lab.command("sample")
@click.option("--seed", type=click.IntRange(0), required=True,
              help="The first draw's seed; the draws of one seed are the same on every machine.")
@click.option("--class", "klass", type=click.Choice(_sample_classes()), default=None,
              help="The fault class to draw (all: COUNT of every class) [default: drawn from the seed].")
@click.option("--count", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Draws (seeds SEED, SEED+1 ...); of every class with --class all.")
@click.option("--record", metavar="DIR", type=click.Path(file_okay=False),
              help="Save each draw (its parameters, the injected truth, every rank's timeline and the "
                   "answers) to DIR/draw-SEED-CLASS.json.gz, the evaluation set (tests/data/draws).")
@_PROM
@click.option("--apply-fix", is_flag=True,
              help="Rerun each draw with the change diagnose predicted and score the prediction "
                   "(about 2x as long).")
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Put logs, shards and mount points here and keep them.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def lab_sample(seed, klass, count, record, prometheus, apply_fix, workdir, as_json):
    """Run scenarios drawn at random: a fault class and its parameters (workers 0-8, batch
    and step, steady/bursty/ramping, 1-4 ranks, spare cores or none, cache warm or cold,
    severity from just over the line to a hang) drawn from SEED, each run live for 20-28 s
    with only stallscope.watch in the trainer and plain reads, then scored: top cause,
    victims and prediction against what was injected; a table per class at the end.
    Classes this machine cannot inject are skipped with the reason."""
    from .lab import commands

    sys.exit(commands.sample(seed, klass, count, record, prometheus, apply_fix, workdir, as_json))


@main.command()
@click.option("--scenario", default="too-few-workers", show_default=True, type=_Scenario(),
              help="Which stall to show (the default needs no root, FUSE or cgroup).")
@click.option("--duration", type=click.FloatRange(5, 3600), default=40.0, show_default=True,
              metavar="SECONDS", help="Measured window after the ranks started.")
def demo(scenario, duration):
    """See stallscope find a real stall in about a minute, on any machine.

    Runs a real 2-rank training job (torch.distributed over gloo, DataLoader workers)
    with one injected stall, the agent with a SIMULATED GPU per rank, and, where
    Prometheus is installed, the generated alert rules; shows the per-rank data-wait
    live, then what stallscope found. Removes everything it started when done or on
    Ctrl-C.
    """
    from .lab import commands

    sys.exit(commands.demo(scenario, duration))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--ranks", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Training processes; more than one runs the command under torchrun.")
@click.option("--out", "out_dir", default=".", show_default=True, metavar="DIR",
              type=click.Path(file_okay=False),
              help="Directory for the report files (created if missing).")
@click.option("--json", "json_out", default="stallscope-run.json", show_default=True, metavar="FILE",
              help="Where to write the report as JSON (diagnose's document, plus the run's ranks); "
                   "a relative FILE is under --out.")
@click.option("--html", "html_out", default="stallscope-run.html", show_default=True, metavar="FILE",
              help="Where to write the report as one self-contained HTML page; a relative FILE is "
                   "under --out.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.2, 3600),
              metavar="SECONDS", help="How often the live view updates.")
@click.option("-q", "--quiet", is_flag=True, help="No live view: the training's output and the report only.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(ranks, out_dir, json_out, html_out, interval, quiet, command):
    """Train on this machine with stallscope watching: stallscope run -- python train.py ...

    \b
    Starts an agent on a private socket (no root, no Prometheus), runs COMMAND (a bare
    `python` is the Python stallscope is installed in) with
    STALLSCOPE_SOCKET and STALLSCOPE_JOB set for its ranks (the trainer calls
    stallscope.watch(loader) or uses an integration; a job named there is followed too),
    prints one line per rank each --interval (elapsed time, data-wait share, batches/s,
    batches, verdict; on a terminal they hold its bottom rows, fitted to its width, and
    the training's output and progress bars scroll above them),
    and at the end the diagnose report of the worst rank, written as JSON and as an HTML
    page (timeline plot, evidence table, causes with their fixes). A failed or
    interrupted training is the report's first line. No GPU signal without NVML.
    Exit status: the training's. Ctrl-C stops the training, writes the report of what
    was measured and leaves nothing else behind.
    """
    from .run.session import run as run_session

    sys.exit(run_session(list(command), ranks=ranks, json_out=json_out, html_out=html_out,
                         interval=interval, quiet=quiet, out_dir=out_dir))


class _Fraction(click.ParamType):
    """A share as ``2%`` or ``0.02`` (issue 34: a bare fraction was read as points)."""
    name = "FRACTION"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        from .run.compare import fraction

        try:
            return fraction(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@main.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("--threshold", default="2%", show_default=True, type=_Fraction(),
              help="B regressed when its data-wait share exceeds A's by more than this many points "
                   "of step time (2% or 0.02).")
@click.option("--step-threshold", default="5%", show_default=True, type=_Fraction(),
              help="B regressed when its step time exceeds A's by more than this share of A's "
                   "(5% or 0.05).")
@click.option("--whole-run", is_flag=True,
              help="Compare the whole runs, each one's start-up (its first batch, while its "
                   "workers start) included; by default the steady states are compared and the "
                   "start-up is shown beside them.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON document.")
def compare(a, b, threshold, step_threshold, whole_run, as_json):
    """Two `stallscope run` reports side by side: data-wait and step time of the worst rank,
    in the steady state (each run's first batch, its workers' start, reported apart).

    \b
    Exit codes: 0 no regression; 1 B regressed past a threshold; 2 a file is not a
    run report; 3 a run failed (non-zero exit, interrupted) or could not be judged
    (verdict unknown: too short), so the comparison proves nothing.
    """
    from .run.compare import main as run_compare

    sys.exit(run_compare(a, b, threshold, step_threshold, as_json, sys.stdout, sys.stderr,
                         whole_run=whole_run))


# Last: every command must be registered before main() runs (`python -m stallscope.cli`
# listed neither run nor compare while this stood above them).
if __name__ == "__main__":
    main()
