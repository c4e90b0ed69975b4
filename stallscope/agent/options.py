"""Command-line options of ``stallscope agent``, kept beside the agent so that cli.py only
parses and dispatches. Root paths are flags (as in node_exporter) so tests point them at
fixtures and the DaemonSet at /host/... mounts.
"""
import click

from ..correlate import options as correlate_options
from ..exporters import options as exporter_options
from ..hook import wire
from .main import Config

OPTIONS = [
    click.option("--listen", default=":9478", show_default=True, metavar="HOST:PORT",
                 help="Address for /metrics, /healthz and /api/v1/*."),
    click.option("--socket", "socket_path", default=wire.DEFAULT_SOCKET, show_default=True,
                 envvar="STALLSCOPE_SOCKET", metavar="PATH",
                 help="Unix socket the training processes report to (env STALLSCOPE_SOCKET)."),
    click.option("--node", default="", envvar="NODE_NAME",
                 help="Node name for ranks that do not report one (env NODE_NAME; default hostname)."),
    click.option("--max-ranks", default=256, show_default=True, type=click.IntRange(1, 65536),
                 help="Most ranks tracked at once; reports from more are rejected and counted."),
    click.option("--rank-ttl", default=120.0, show_default=True, type=click.FloatRange(1, 86400),
                 metavar="SECONDS", help="Forget a rank silent for this long (its process gone sooner)."),
    click.option("--rank-exit-grace", default=30.0, show_default=True,
                 type=click.FloatRange(0, 3600), metavar="SECONDS",
                 help="Keep an exited rank's series this long, so the final batches get scraped."),
    click.option("--timeline-seconds", default=900.0, show_default=True,
                 type=click.FloatRange(10, 86400), metavar="SECONDS",
                 help="How much per-rank history to keep for the correlator and the API."),
    click.option("--path.procfs", "procfs", default="/proc", show_default=True, metavar="PATH",
                 help="procfs mount point (/host/proc in a DaemonSet)."),
    click.option("--path.sysfs", "sysfs", default="/sys", show_default=True, metavar="PATH",
                 help="sysfs mount point."),
    click.option("--path.cgroupfs", "cgroupfs", default="/sys/fs/cgroup", show_default=True,
                 metavar="PATH", help="cgroup filesystem root."),
    click.option("--path.rootfs", "rootfs", default="/", show_default=True, metavar="PATH",
                 help="The host's root filesystem (/host/root in a DaemonSet)."),
] + exporter_options.OPTIONS + correlate_options.OPTIONS


def add_options(fn):
    for option in reversed(OPTIONS):
        fn = option(fn)
    return fn


def config_from(kwargs):
    return Config(listen=kwargs.pop("listen"), socket=kwargs.pop("socket_path"),
                  node=kwargs.pop("node"), max_ranks=kwargs.pop("max_ranks"),
                  rank_ttl=kwargs.pop("rank_ttl"), rank_exit_grace=kwargs.pop("rank_exit_grace"),
                  timeline_seconds=kwargs.pop("timeline_seconds"),
                  procfs=kwargs.pop("procfs"), sysfs=kwargs.pop("sysfs"),
                  cgroupfs=kwargs.pop("cgroupfs"), rootfs=kwargs.pop("rootfs"),
                  options=kwargs)
