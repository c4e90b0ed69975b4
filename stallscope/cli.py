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


if __name__ == "__main__":
    main()
