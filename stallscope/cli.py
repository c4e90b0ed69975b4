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


if __name__ == "__main__":
    main()
