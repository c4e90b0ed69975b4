"""``stallscope agent`` flags of the exporters: one ``--exporter.NAME/--no-exporter.NAME``
pair per registered exporter (unset means its default; setting it explicitly makes
"not available on this node" an error), plus the schedule and per-exporter settings.
Options land in ``Config.options`` under the names given here."""
import re

import click

from ..gpu import options as gpu_options
from .fuse import DEFAULT_EXCLUDE
from .registry import EXPORTERS


def _regex(value):
    try:
        re.compile(value)
    except re.error as e:
        raise click.BadParameter("not a regular expression: %s" % e)
    return value


def _toggle(entry):
    return click.option(
        "--exporter.%s/--no-exporter.%s" % (entry.name, entry.name), "exporter_" + entry.name,
        default=None, help="%s [default: %s]" % (entry.help, "on" if entry.default else "off"))


OPTIONS = [_toggle(e) for e in EXPORTERS] + [
    click.option("--exporter.interval", "exporter_interval", default=2.0, show_default=True,
                 type=click.FloatRange(0.1, 3600), metavar="SECONDS",
                 help="How often every exporter collects (off the scrape path; /metrics "
                      "serves the last collection)."),
    click.option("--exporter.timeout", "exporter_timeout", default=2.0, show_default=True,
                 type=click.FloatRange(0.05, 3600), metavar="SECONDS",
                 help="Deadline of one collection; an exporter past it reports "
                      "stallscope_exporter_success 0 and is not started again until it returns."),
    click.option("--exporter.fuse.probe-timeout", "exporter_fuse_probe_timeout", default=2.0,
                 show_default=True, type=click.FloatRange(0.05, 600), metavar="SECONDS",
                 help="A FUSE mount whose statfs probe takes longer is reported stuck; the "
                      "probe is not re-issued until it returns."),
    click.option("--exporter.fuse.exclude-fstypes", "exporter_fuse_exclude_fstypes",
                 default=DEFAULT_EXCLUDE, show_default=True, metavar="REGEX",
                 callback=lambda _ctx, _param, v: _regex(v),
                 help="FUSE filesystem types not to watch."),
    click.option("--exporter.workers.per-worker", "exporter_workers_per_worker", is_flag=True,
                 help="Also export CPU and RSS per loader worker (num_workers more series per "
                      "rank; per-worker figures are always in /api/v1/ranks)."),
] + gpu_options.OPTIONS  # the gpu exporter's settings
