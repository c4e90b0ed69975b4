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
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    """Seconds in a Prometheus duration ("1h30m" -> 5400.0)."""
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration))


@dataclasses.dataclass(frozen=True)
class Burn:
    """One multi-window burn-rate alert (the SRE Workbook's "multiwindow, multi-burn-rate
    alerts"): it fires while the job spends its error budget ``factor`` times faster
    than the SLO allows over both the ``long`` window (enough budget is gone to matter)
    and the ``short`` one (it is still going on: the short window resets the alert soon
    after the stall ends)."""
    alert: str
    severity: str      # "critical" pages, "warning" opens a ticket (Alertmanager routes on it)
    long: str
    short: str
    factor: float
    for_: str


# The Workbook's table for a 98 % SLO, in kubernetes-mixin's `for:` (a blip of one
# evaluation does not page): 14.4x over 1h and 5m spends 2 % of a 30-day budget, 6x over
# 6h and 30m 5 %, 1x over 3d and 6h 10 %.
BURNS = (
    Burn("StallscopeInputGoodputFastBurn", "critical", "1h", "5m", 14.4, "2m"),
    Burn("StallscopeInputGoodputSlowBurn", "critical", "6h", "30m", 6.0, "15m"),
    Burn("StallscopeInputGoodputBudgetBurn", "warning", "3d", "6h", 1.0, "3h"),
)


@dataclasses.dataclass(frozen=True)
class SLO:
    """Input goodput as an SLO: 1 - the worst rank's share of step time blocked in
    next(loader) (Google's DATA_LOADING_SYNC badput), per job. Its error budget,
    1 - target, is the data-wait line itself (``data_wait_warning``: one number; load()
    keeps the two together). ``period`` is the window the dashboards' budget left is
    counted over; ``targets`` overrides the target per job ("namespace/job": target)."""
    target: float = round(1 - vocabulary.DATA_WAIT_LINE, 12)
    period: str = "7d"
    burns: tuple = BURNS
    targets: tuple = ()

    @property
    def budget(self) -> float:
        return round(1 - self.target, 12)

    def windows(self) -> tuple:
        """Every window the burn alerts read, shortest first."""
        return tuple(sorted({w for b in self.burns for w in (b.long, b.short)}, key=seconds))


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
    # Straggler: worst rank above `factor` x the job's median (and over the warning line).
    straggler_factor: float = vocabulary.STRAGGLER_FACTOR
    # The cause alerts' lines, by alert name; an alert not named here keeps the
    # vocabulary's line (stallscope/vocabulary/causes.py).
    lines: tuple = ()
    # Price of one accelerator-hour (any currency): when set, the idle-accelerator
    # recording rule gets a cost per day beside it, and the job dashboard shows it.
    gpu_hour_price: float = 0.0

    # Input goodput as an SLO: target, budget period, burn-rate alerts, per-job targets.
    slo: SLO = SLO()
    # Series that say a pod runs, for StallscopeJobNotWatched (a job whose pods run while
    # no hook of it reports); kube-state-metrics' by default. Empty: the rule does not
    # ask, and a finished job's silence fires it too.
    pod_running: str = 'kube_pod_status_phase{phase="Running"} == 1'

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

    @property
    def data_wait_page(self):
        """The slowest rank's wait share that pages when it holds (the smallest page burn
        factor x the error budget: 6 x 2 % = 12 % by default); the dashboards' red."""
        pages = [b.factor for b in self.slo.burns if b.severity == "critical"]
        return round(min(pages) * self.slo.budget, 12) if pages else None

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


def _validate_slo(cfg):
    slo = cfg.slo
    if isinstance(slo.target, bool) or not isinstance(slo.target, (int, float)) or not 0 < slo.target < 1:
        raise ValueError("slo.target: expected a number between 0 and 1, got %r" % (slo.target,))
    if abs(slo.budget - cfg.data_wait_warning) > 1e-9:
        raise ValueError("slo.target %s and data_wait_warning %s disagree: the error budget "
                         "(1 - target) is the data-wait line; set one of them"
                         % (slo.target, cfg.data_wait_warning))
    for name, value in [("slo.period", slo.period)] + [
            ("slo.burns[%d].%s" % (i, f), getattr(b, f)) for i, b in enumerate(slo.burns)
            for f in ("long", "short", "for_")]:
        if not isinstance(value, str) or not _DURATION.match(value):
            raise ValueError("%s: %r is not a Prometheus duration (e.g. 5m)" % (name, value))
    names = [b.alert for b in slo.burns]
    for b in slo.burns:
        if not re.fullmatch(r"Stallscope[A-Za-z]+", b.alert) or names.count(b.alert) > 1:
            raise ValueError("slo.burns: %r: expected a unique alert name Stallscope..." % b.alert)
        if b.severity not in ("critical", "warning"):
            raise ValueError("slo.burns: %s: severity %r is not critical (page) or warning (ticket)"
                             % (b.alert, b.severity))
        if isinstance(b.factor, bool) or not isinstance(b.factor, (int, float)) or b.factor <= 0:
            raise ValueError("slo.burns: %s: factor %r is not a positive number" % (b.alert, b.factor))
        if not seconds(cfg.rate_window) <= seconds(b.short) < seconds(b.long):
            raise ValueError("slo.burns: %s: expected rate_window (%s) <= short (%s) < long (%s)"
                             % (b.alert, cfg.rate_window, b.short, b.long))
    for key, target in slo.targets:
        if not re.fullmatch(r"[^/\s\"]+/[^/\s\"]+", key):
            raise ValueError('slo.targets: %r is not "namespace/job"' % (key,))
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
            raise ValueError("slo.targets: %s: expected a number between 0 and 1, got %r" % (key, target))


def validate(cfg):
    """Raise ValueError with one line naming the first bad field."""
    for name in _DURATIONS:
        if not _DURATION.match(getattr(cfg, name)):
            raise ValueError("%s: %r is not a Prometheus duration (e.g. 5m)" % (name, getattr(cfg, name)))
    for f in dataclasses.fields(cfg):
        if f.type is float and not isinstance(getattr(cfg, f.name), (int, float)):
            raise ValueError("%s: expected a number, got %r" % (f.name, getattr(cfg, f.name)))
    _validate_slo(cfg)
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
    slo = values.get("slo", DEFAULT.slo)
    if isinstance(slo, dict):
        slo = _slo_from_json(slo)
    # one line: the SLO's error budget (1 - target) is the data-wait line; a config sets
    # either (the other follows) or both alike (validate says when they disagree)
    target_set = isinstance(values.get("slo"), SLO) or "target" in (values.get("slo") or {})
    line = values.get("data_wait_warning")
    if target_set and line is None and _number(slo.target):
        values["data_wait_warning"] = slo.budget
    elif not target_set and _number(line):
        slo = dataclasses.replace(slo, target=round(1 - line, 12))
    values["slo"] = slo
    return validate(dataclasses.replace(DEFAULT, **values))


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _slo_from_json(doc):
    known = {f.name for f in dataclasses.fields(SLO)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError("slo: unknown field(s) %s; known: %s"
                         % (", ".join(unknown), ", ".join(sorted(known))))
    values = dict(doc)
    if "targets" in values:
        if not isinstance(values["targets"], dict):
            raise ValueError('slo.targets: expected an object of {"namespace/job": target}')
        values["targets"] = tuple(sorted(values["targets"].items()))
    if "burns" in values:
        fields = [f.name for f in dataclasses.fields(Burn)]
        burns = []
        for b in values["burns"] if isinstance(values["burns"], list) else [None]:
            if not isinstance(b, dict) or set(b) != {f.rstrip("_") for f in fields}:
                raise ValueError("slo.burns: expected a list of objects with %s"
                                 % ", ".join(f.rstrip("_") for f in fields))
            burns.append(Burn(**{f: b[f.rstrip("_")] for f in fields}))
        values["burns"] = tuple(burns)
    return dataclasses.replace(DEFAULT.slo, **values)
