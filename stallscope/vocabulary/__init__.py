"""The one vocabulary of stallscope: every metric, label set, correlator signal, cause,
verdict line and node exporter, declared once (standard library only).

The agent's parts emit what is declared here, the correlator probes the signals and
lines declared here, the mixin generates its rules and dashboards from it, ``stallscope
diagnose`` reads its lines, advice and alerts from it, and the docs and the lab name its
entries. Nothing restates an entry; tests/vocabulary/ fails when an emitted metric is
not declared, a declared one is never emitted, a signal has no producer, or a cause
lacks an alert, a runbook or advice.

- entries.py  the kinds of entry (Unit, Metric, Signal, Exporter, Line, CauseAlert, Cause)
- labels.py   label sets (identity in one order)
- hook.py     what the hook's reports feed: per-rank wait and step, loader, shards, cache
- node.py     the node exporters (the registry) with their metrics and signals
- agent.py    the agent's self-health and the correlator's outputs
- causes.py   verdicts, the verdict lines, every cause with its lines, alerts and advice
- checks.py   set-up checks: loader set-ups wrong on their face at the first batch
"""
from typing import TypeVar

from . import agent, causes, checks, hook, labels, node
from .causes import ATTRIBUTE, DATA_WAIT_LINE, MIN_BATCHES, STRAGGLER_FACTOR, VERDICTS
from .entries import (
    CADENCES,
    KINDS,
    SCOPES,
    UNITS,
    Cause,
    CauseAlert,
    Check,
    Exporter,
    Line,
    LoaderState,
    Metric,
    Signal,
    Unit,
    unit_text,
)

__all__ = ["ATTRIBUTE", "CAUSES", "CHECKS", "Check", "DATA_WAIT_LINE", "EXPORTERS",
           "LOADER_STATES", "MIN_BATCHES", "METRICS", "SIGNALS", "STRAGGLER_FACTOR", "VERDICTS", "Cause",
           "CauseAlert", "Exporter", "Line", "LoaderState", "Metric", "Signal", "Unit", "cause", "labels",
           "metric", "signal", "unit_text"]

METRICS: tuple[Metric, ...] = hook.METRICS + node.METRICS + agent.METRICS
SIGNALS: tuple[Signal, ...] = hook.SIGNALS + node.SIGNALS
EXPORTERS: tuple[Exporter, ...] = node.EXPORTERS
CAUSES: tuple[Cause, ...] = causes.CAUSES
LOADER_STATES: tuple[LoaderState, ...] = node.LOADER_STATES
CHECKS: tuple[Check, ...] = checks.CHECKS

_E = TypeVar("_E", Metric, Signal, Exporter, Cause, Check)


def _index(entries: tuple[_E, ...], what: str) -> dict[str, _E]:
    out: dict[str, _E] = {}
    for e in entries:
        if e.name in out:
            raise ValueError("%s %s is declared twice" % (what, e.name))
        out[e.name] = e
    return out


METRIC = _index(METRICS, "metric")
SIGNAL = _index(SIGNALS, "signal")
CAUSE = _index(CAUSES, "cause")
EXPORTER = _index(EXPORTERS, "exporter")
CHECK = _index(CHECKS, "check")
CAUSE_NAMES: tuple[str, ...] = tuple(c.name for c in CAUSES)


def metric(name: str) -> Metric:
    return METRIC[name]


def signal(name: str) -> Signal:
    return SIGNAL[name]


def cause(name: str) -> Cause:
    return CAUSE[name]


def check_of(name: str) -> Check:
    return CHECK[name]


def line_of(cause_name: str, signal_name: str) -> Line:
    """The co-occurrence line of ``cause_name`` on ``signal_name``."""
    for line in CAUSE[cause_name].lines:
        if line.signal == signal_name:
            return line
    raise KeyError("cause %s has no line on %s" % (cause_name, signal_name))


def cause_alerts() -> dict[str, tuple[Cause, CauseAlert]]:
    """{alert name: (cause, alert)} of every alert that pages on a cause."""
    return {a.name: (c, a) for c in CAUSES for a in c.alerts}


def check() -> None:
    """Raise ValueError where the catalog contradicts itself (run at import)."""
    for m in METRICS:
        if m.kind not in KINDS:
            raise ValueError("metric %s: unknown kind %s" % (m.name, m.kind))
        if (m.kind == "counter") != m.name.endswith("_total"):
            raise ValueError("metric %s: counters, and only counters, end in _total" % m.name)
        if not m.name.startswith("stallscope_"):
            raise ValueError("metric %s: not in the stallscope_ namespace" % m.name)
        if bool(m.buckets) != (m.kind == "histogram"):
            raise ValueError("metric %s: buckets go with histograms, and only with them" % m.name)
        mine = [n for n in m.labels if n in labels.IDENTITY]
        if mine != [n for n in labels.IDENTITY if n in m.labels]:
            raise ValueError("metric %s: identity labels out of order" % m.name)
    for s in SIGNALS:
        if s.unit not in UNITS or not set(s.scopes) <= set(SCOPES) or s.cadence not in CADENCES:
            raise ValueError("signal %s: unknown unit, scope or cadence" % s.name)
        if s.query and "$sel" not in s.query:
            raise ValueError("signal %s: its query has no $sel" % s.name)
    for c in CAUSES:
        for line in c.lines:
            if line.signal not in SIGNAL:
                raise ValueError("cause %s: undeclared signal %s" % (c.name, line.signal))
        for a in c.alerts:
            if a.signal not in SIGNAL or not SIGNAL[a.signal].query:
                raise ValueError("cause %s: alert %s needs a signal with a query" % (c.name, a.name))
            if a.op not in (">", "<", "=="):
                raise ValueError("cause %s: alert %s compares with %r" % (c.name, a.name, a.op))
        if not c.advice or not c.runbook_alert:
            raise ValueError("cause %s: needs advice and a runbook" % c.name)
    for k in CHECKS:
        if k.unit not in UNITS + ("cores",) or not k.fix or "<value>" not in k.text:
            raise ValueError("check %s: needs a known unit, a fix and <value> in its text" % k.name)


check()
