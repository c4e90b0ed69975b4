"""The one config the mixin generates everything from: selectors, thresholds, windows
and the runbook base URL (the monitoring-mixin discipline: dashboards, recording rules
and alerts never spell a threshold or a window themselves, they read it from here).

Override fields from a JSON file (``stallscope alerts --config FILE``) or in code with
``dataclasses.replace(DEFAULT, ...)``; the tests build their short-window config that way.
"""
import dataclasses
import json
import re

from .. import vocabulary

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


@dataclasses.dataclass(frozen=True)
class MixinConfig:
    # Label matchers added to every stallscope series selector, e.g. 'cluster="prod"'.
    selector: str = ""
    # Matchers for the `up` series of the agents' scrape job (a PodMonitor's job label
    # is "<namespace>/<name>", a static config's is its job_name).
    agent_selector: str = 'job=~".*stallscope.*"'

    # Windows.
    rate_window: str = "5m"            # rate() window of the SLI and every cause signal
    data_wait_for: str = "15m"         # the headline's `for:`
    straggler_for: str = "15m"
    cause_for: str = "10m"
    health_for: str = "5m"
    silent_lookback: str = "1h"        # how far back a rank counts as "was reporting"

    # The SLI: share of a rank's step time spent blocked in next(loader). The warning line
    # is also the correlator's input_bound line, diagnose's, and the "waiting rank" gate
    # of the cause alerts and the straggler alert (stallscope/vocabulary/causes.py).
    data_wait_warning: float = vocabulary.DATA_WAIT_LINE
    data_wait_critical: float = vocabulary.DATA_WAIT_CRITICAL
    # Straggler: worst rank above `factor` x the job's median (and over the warning line).
    straggler_factor: float = vocabulary.STRAGGLER_FACTOR
    # The cause alerts' lines, by alert name; an alert not named here keeps the
    # vocabulary's line (stallscope/vocabulary/causes.py).
    lines: tuple = ()
    # Price of one accelerator-hour (any currency): when set, the idle-accelerator
    # recording rule gets a cost per day beside it, and the job dashboard shows it.
    gpu_hour_price: float = 0.0

    # Where the alerts' runbook_url points: base + AlertName + ".md". The default is a
    # placeholder (PLACEHOLDER_RUNBOOK_BASE_URL): `stallscope alerts` warns while it is set
    # (issue 34: every link 404ed and nothing said so).
    runbook_base_url: str = "https://github.com/stallscope/stallscope/blob/main/runbooks/"

    # Dashboards.
    dashboard_uid_prefix: str = "stallscope-"
    dashboard_tags: tuple = ("stallscope",)
    dashboard_refresh: str = "30s"
    dashboard_time_from: str = "now-1h"
    topk: int = 10

    def runbook_url(self, alert):
        return self.runbook_base_url + alert + ".md"

    def line(self, alert: str) -> float:
        """The threshold of cause alert ``alert``: the configured one, else the vocabulary's."""
        for name, value in self.lines:
            if name == alert:
                return value
        return vocabulary.cause_alerts()[alert][1].line

    def sel(self, *matchers):
        """A selector body joining the configured matchers with extra ones."""
        parts = [m for m in (self.selector,) + matchers if m]
        return ",".join(parts)


DEFAULT = MixinConfig()
PLACEHOLDER_RUNBOOK_BASE_URL = DEFAULT.runbook_base_url


def placeholder_warning(cfg):
    """One line when the alerts' runbook links point at the placeholder, else None."""
    if cfg.runbook_base_url != PLACEHOLDER_RUNBOOK_BASE_URL:
        return None
    return ("runbook_base_url is the placeholder %s: the alerts' runbook_url links lead "
            "nowhere until it points at your copy of runbooks/ (--config FILE with "
            '{"runbook_base_url": "https://..."})' % PLACEHOLDER_RUNBOOK_BASE_URL)

_DURATIONS = ("rate_window", "data_wait_for", "straggler_for", "cause_for", "health_for",
              "silent_lookback")


def validate(cfg):
    """Raise ValueError with one line naming the first bad field."""
    for name in _DURATIONS:
        if not _DURATION.match(getattr(cfg, name)):
            raise ValueError("%s: %r is not a Prometheus duration (e.g. 5m)" % (name, getattr(cfg, name)))
    for f in dataclasses.fields(cfg):
        if f.type is float and not isinstance(getattr(cfg, f.name), (int, float)):
            raise ValueError("%s: expected a number, got %r" % (f.name, getattr(cfg, f.name)))
    if cfg.topk < 1:
        raise ValueError("topk: must be at least 1")
    known = vocabulary.cause_alerts()
    for name, value in cfg.lines:
        if name not in known:
            raise ValueError("lines: %s is not a cause alert; known: %s" % (name, ", ".join(sorted(known))))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("lines: %s: expected a number, got %r" % (name, value))
    return cfg


def load(path=None, **overrides):
    """DEFAULT updated from a JSON object in ``path`` and then from ``overrides``."""
    values = {}
    if path:
        try:
            with open(path) as f:
                values = json.load(f)
        except OSError as e:
            raise ValueError("cannot read %s: %s" % (path, e.strerror)) from e
        except json.JSONDecodeError as e:
            raise ValueError("%s is not valid JSON: %s" % (path, e)) from None
        if not isinstance(values, dict):
            raise ValueError("%s: expected a JSON object of config fields" % path)
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(MixinConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError("unknown config field(s) %s; known: %s"
                         % (", ".join(unknown), ", ".join(sorted(known))))
    if "dashboard_tags" in values:
        values["dashboard_tags"] = tuple(values["dashboard_tags"])
    if "lines" in values:
        if not isinstance(values["lines"], dict):
            raise ValueError("lines: expected an object of {alert name: threshold}")
        values["lines"] = tuple(sorted(values["lines"].items()))
    return validate(dataclasses.replace(DEFAULT, **values))
