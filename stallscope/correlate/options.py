"""``stallscope agent`` options of the correlator (added to agent/options.py's list)."""
import click

OPTIONS = [
    click.option("--correlate.interval", "correlate_interval", default=15.0, show_default=True,
                 type=click.FloatRange(1, 3600), metavar="SECONDS",
                 help="How often the correlator re-analyses every rank for the metrics."),
    click.option("--correlate.window", "correlate_window", default=300.0, show_default=True,
                 type=click.FloatRange(10, 86400), metavar="SECONDS",
                 help="How much history each analysis covers (and /api/v1/diagnosis's default)."),
]
