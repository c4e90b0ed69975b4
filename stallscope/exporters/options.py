"""``stallscope agent`` flags of the exporters: one ``--exporter.NAME/--no-exporter.NAME``
pair per registered exporter (unset means its default; setting it explicitly makes
"not available on this node" an error), plus the schedule and per-exporter settings.
Options land in ``Config.options`` under the names given here."""
import click

from .registry import EXPORTERS


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
]
