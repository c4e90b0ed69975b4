"""The kinds of entry the vocabulary declares (standard library only)."""
from __future__ import annotations

import dataclasses

KINDS = ("counter", "gauge", "histogram")
SCOPES = ("rank", "node", "gpu")
# How often a signal is sampled, which sizes its history in the agent: once per batch or
# read (as fast as the loader), a GPU's sample period (10 Hz at most), or once per
# exporter collection (1 Hz at most).
CADENCES = ("batch", "gpu", "collection")


@dataclasses.dataclass(frozen=True)
class Unit:
    """What a signal's samples (and a check's measure) count. ``suffix``: how a value in
    it is written in an alert's text and a threshold in the docs (after the number)."""
    name: str
    help: str
    suffix: str = ""
    percent: bool = False   # written as a percentage: 0.25 -> 25%


UNIT_ENTRIES = (
    Unit("ratio", "a share in [0, 1] (of time, of periods, of capacity)", "%", percent=True),
    Unit("seconds", "a duration", "s"),
    Unit("count", "a number of things at the sample's time (workers, requests, CPUs)"),
    Unit("count_rate", "things a second over the sample's interval: a counter's rate (faults, "
         "context switches)", "/s"),
    Unit("flag", "1 or 0"),
    Unit("bytes", "a size"),
    Unit("bytes_rate", "bytes a second over the sample's interval: a byte counter's rate", " B/s"),
    Unit("pid", "a process id (as a number; never lined up with the stalls)"),
)
UNITS = tuple(u.name for u in UNIT_ENTRIES)


def _num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def unit_text(unit: str, value: float) -> str:
    """``value`` in ``unit`` as an alert's text and the docs write a line: 0.25 ratio ->
    "25%", 1.5 seconds -> "1.5s", 200 count_rate -> "200/s"."""
    u = next(u for u in UNIT_ENTRIES if u.name == unit)
    if u.percent:
        return "%s%%" % _num(round(float(value) * 100, 6))
    return _num(value) + u.suffix


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric family as Prometheus sees it (counters end in ``_total``)."""
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    producer: str                       # the part that emits it
    buckets: tuple[float, ...] = ()     # histograms only

    @property
    def family_name(self) -> str:
        """The name client libraries take (without ``_total`` for counters)."""
        return self.name[:-len("_total")] if self.kind == "counter" else self.name


@dataclasses.dataclass(frozen=True)
class Signal:
    """A timeline the correlator can line up with the stalls: samples in the agent's
    SampleStore, each a level or a rate over its interval, never a raw counter.

    ``query`` is its face in Prometheus where it has one: a PromQL template per pod
    (``$sel`` is the selector body, ``$w`` the rate window) whose result carries
    ``query_by``."""
    name: str
    unit: str
    scopes: tuple[str, ...]
    producer: str
    help: str
    query: str = ""
    query_by: tuple[str, ...] = ()
    cadence: str = "collection"
    # A condition of the rank's set-up or placement (num_workers, the NUMA node its
    # loader runs on): it holds while the rank runs, it does not come and go with the
    # stalls, so only a standing cause may be judged on it (issue 29).
    condition: bool = False


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """A state a loader task's time is split into (exporters/loaderstate.py, issue 30)."""
    name: str
    help: str


@dataclasses.dataclass(frozen=True)
class Exporter:
    """One node exporter: ``--exporter.NAME``, its class in ``stallscope.exporters``."""
    name: str
    target: str          # "module:Class" under stallscope.exporters
    default: bool
    help: str


@dataclasses.dataclass(frozen=True)
class Line:
    """A co-occurrence line: the correlator counts a sample of ``signal`` as active when
    it is past ``threshold`` (above it, or below it with ``above=False``)."""
    signal: str
    threshold: float
    above: bool = True
    scopes: tuple[str, ...] = ("rank", "node")


@dataclasses.dataclass(frozen=True)
class CauseAlert:
    """An alert that pages on a cause: ``signal``'s query compared with ``line`` for a pod
    with a waiting rank. ``why`` says why the line differs from the cause's co-occurrence
    line on the same signal, where it does. ``description`` may use <where> (the pod,
    job and node), <window> (the rate window) and <line> (the threshold, formatted)."""
    name: str
    signal: str
    op: str
    line: float
    summary: str
    description: str
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Cause:
    """A reason a rank waits on its input pipeline, named by its fix.

    ``lines``: the signals the correlator probes for it (empty for causes it computes
    from the loader's own numbers); ``alerts``: the alerts that page on it (empty when
    the headline alert covers it); ``runbook_alert``: whose runbook it is in;
    ``advice``: the first thing to do. ``shared``: a node-wide symptom that other tenants
    share (pressure, the node's disk writes); when one of the rank's own causes explains
    the wait too, that one leads (issue 16). ``symptom_of``: causes whose fault makes
    this one's signals move too; when one of them explains the wait, it leads.
    ``computed``: the correlator scores it from
    the hook's own numbers, never by co-occurrence; its lines, if any, are where
    ``stallscope diagnose`` judges it from Prometheus alone, where the signal's value is
    the score. ``standing``: a condition of the set-up or placement (its lines are on
    condition signals) that holds while the rank waits: named when it is present and the
    rank is over the line, scored by how much of the wait its model explains
    (correlate/standing_causes.py), never by whether it moves with the stalls."""
    name: str
    what: str
    lines: tuple[Line, ...]
    alerts: tuple[CauseAlert, ...]
    runbook_alert: str
    advice: str
    shared: bool = False
    computed: bool = False
    symptom_of: tuple[str, ...] = ()
    standing: bool = False
    # the settings its advice changes, and the advice when a prediction rules them out
    # (diagnose/nextsteps.py: a next step never recommends what the top cause's
    # prediction says will not help, issue 29)
    advises: tuple[str, ...] = ()
    advice_otherwise: str = ""

    @property
    def kind(self) -> str:
        """How the correlator judges it: ``co_occurrence`` (its signals move with the
        stalls), ``computed`` (from the hook's own numbers), ``standing`` (a condition's
        model) or ``remainder`` (unexplained: what the others leave)."""
        if self.standing:
            return "standing"
        if self.computed:
            return "computed"
        return "co_occurrence" if self.lines else "remainder"

    @property
    def runbook(self) -> str:
        return "runbooks/%s.md" % self.runbook_alert


@dataclasses.dataclass(frozen=True)
class Check:
    """A set-up check (issue 32, item 3): a DataLoader set-up that is wrong on its face
    at the first batch, judged from the loader's settings and what the agent knows of
    the pod, before any stall. A check that fails is a warning with ``measure`` (its
    unit ``unit``) against ``line`` (wrong when above it, or below it with
    ``above=False``): never a verdict, never a page (no alert is generated for it).
    ``text`` may use <value> and <line> (formatted in ``unit``)."""
    name: str
    what: str
    measure: str
    unit: str
    line: str          # how the line is drawn, in words (it depends on the rank's set-up)
    text: str
    fix: str
