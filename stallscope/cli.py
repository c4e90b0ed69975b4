"""The ``stallscope`` command: parses and dispatches, nothing more."""
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
@click.option("--config", "config_path", metavar="FILE", help=_CONFIG_HELP)
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 and show a diff where the files differ from the generator.")
def alerts(out, prometheusrule, config_path, check):
    """Generate the Prometheus recording rules and alerts (with runbook_url annotations).

    \b
    Files:
      DIR/rules.yaml    recording rules for the data-wait SLI (per rank; max and median per job)
      DIR/alerts.yaml   StallscopeDataWaitHigh/Critical, StallscopeStragglerRank, the cause
                        alerts (throttling, pressure, /dev/shm, FUSE, shard reads, cache) and
                        self-health; each has a runbook in runbooks/<AlertName>.md
    Load both files with `rule_files:`; check them with `promtool check rules`.
    """
    from .mixin import commands

    sys.exit(commands.alerts(out, prometheusrule, config_path, check))


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
@click.option("-n", "--namespace", default=None, help="The pod's namespace (needed only when the name is in several).")
@click.option("--prometheus", "prometheus_url", envvar="STALLSCOPE_PROMETHEUS_URL", metavar="URL",
              help="Prometheus that scrapes the agents [env STALLSCOPE_PROMETHEUS_URL].")
@click.option("--agent", "agent_url", metavar="URL",
              help="The node agent to ask (default: found from its own metrics in Prometheus).")
@click.option("--window", default="15m", show_default=True, metavar="DURATION",
              help="How far back to look: 90s, 15m, 1h.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.option("--stacks", is_flag=True,
              help="Also sample the rank's main process and loader workers with py-spy "
                   "(run on the pod's node; needs ptrace).")
@click.option("--plot", metavar="FILE.png", help="Write a PNG of data-wait against GPU busy (matplotlib).")
def diagnose(pod, namespace, prometheus_url, agent_url, window, as_json, stacks, plot):
    """Why does POD's rank wait on its input pipeline? From the page to the cause.

    \b
    1. Cluster view (Prometheus): the pod's job, rank and node; its data-wait ratio
       against the job's max and median; the slowest ranks; since when.
    2. Node detail (the node's agent, found in Prometheus or given with --agent): the
       correlator's verdict, causes ranked with evidence, loader settings, the worker
       count that keeps up. With --agent alone it works without Prometheus.
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

    sys.exit(run_diagnose(pod, namespace=namespace, prometheus_url=prometheus_url,
                          agent_url=agent_url, window=window, as_json=as_json, stacks=stacks,
                          plot=plot))


if __name__ == "__main__":
    main()
