"""Whether a standing stall needs its causes ranked again.

A stall that goes on is re-analysed every few seconds while young and every scheduled
interval once it is old (the agent's correlator part). At 8 ranks x 8 workers with every
rank waiting, those repeats were most of the agent's analysis CPU, and for a stall that
holds steady they rank the same causes again on a window that only grew (issue 15).
So a repeat is skipped while what the ranking rests on has not moved:

- the same stall: its start where it was, within SINCE_SLACK_S or a quarter of its
  span (the change-point estimate of a stall that began before the detector's horizon,
  or in its noise, moves by a second or so from one test to the next);
- the same loader settings and the same signals recorded for the rank (a signal that
  appears, e.g. throttling that begins, is a new input);
- its data-wait share within SHARE_ABS or SHARE_REL of the share at its last analysis
  (a cause that takes hold or lets go moves the wait);

and never for longer than MAX_AGE_S, so a slow drift in a signal's level still reaches
the cause scores within two minutes (one minute cost ~0.14 % of a core at 8 ranks x 8
workers, every rank stalled: a full analysis a rank a minute, 15-27 ms each; the cause
alerts' `for:` is 10 minutes). The verdict itself is the detector's, every second;
``/api/v1/diagnosis`` analyses on demand and is not affected.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ...report import LoaderSettings

MAX_AGE_S = 120.0
# A stall younger than this is always re-ranked: its causes settle in its first half
# minute (the first analysis, on a few batches, may have found none yet).
SETTLED_AFTER_S = 30.0
SHARE_ABS = 0.02
SHARE_REL = 0.10
SINCE_SLACK_S = 10.0
STALL_REFRESH_S = 2.0   # re-analyse a young stall this often
MIN_STALL_WINDOW_S = 10.0


@dataclasses.dataclass(frozen=True)
class Basis:
    """What a stall's analysis rested on."""
    since_ns: int
    share: float
    loader: tuple[tuple[str, Any], ...]
    signals: frozenset[str]

    @classmethod
    def of(cls, since_ns: int, share: float, loader: LoaderSettings | Mapping[str, Any] | None,
           signals: Iterable[str]) -> Basis:
        loader = LoaderSettings.of(loader)  # a dict from an in-process caller (tests)
        settings = tuple(sorted((k, repr(v)) for k, v in (loader.to_json() if loader else {}).items()))
        return cls(since_ns, share, settings, frozenset(signals))


def unchanged(old: Basis | None, new: Basis, age_s: float, now_ns: int) -> bool:
    """True when ``new`` is close enough to ``old`` (analysed ``age_s`` ago) that the
    analysis would rank the same causes."""
    if old is None or age_s >= MAX_AGE_S:
        return False
    if (old.loader, old.signals) != (new.loader, new.signals):
        return False
    span_s = (now_ns - min(old.since_ns, new.since_ns)) / 1e9
    if abs(new.since_ns - old.since_ns) / 1e9 > max(SINCE_SLACK_S, span_s / 4):
        return False
    return abs(new.share - old.share) <= max(SHARE_ABS, SHARE_REL * old.share)


def stall_window(since_ns: int, now_ns: int, window_s: float) -> float:
    """What a stall's analysis covers: the stall and as much before it (the quiet time
    its causes' signals are compared against), within the scheduled ``window_s``."""
    span = (now_ns - since_ns) / 1e9
    return min(window_s, max(MIN_STALL_WINDOW_S, 2 * span))


def stall_refresh(since_ns: int, now_ns: int, every_s: float) -> float:
    """How often a stall is re-analysed: every STALL_REFRESH_S while it is young, then
    less often as it ages, up to the scheduled interval ``every_s``. Its causes settle in
    its first half minute; re-ranking them every 2 s for as long as it lasts cost most of
    the agent's CPU when every rank of a busy node waited (issue 15)."""
    span = (now_ns - since_ns) / 1e9
    return min(every_s, max(STALL_REFRESH_S, span / 4))
