"""Durations as people and Prometheus write them: ``90s``, ``15m``, ``1h30m``, ``2d``."""
from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse(text: str | float) -> float:
    """Seconds in ``text``; a bare number is seconds. ValueError with the reason."""
    s = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        seconds = float(s)
    else:
        parts = _PART.findall(s)
        if not parts or "".join(n + u for n, u in parts) != s:
            raise ValueError("bad duration %r: use e.g. 90s, 15m, 1h" % text)
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not 1 <= seconds <= 30 * 86400:
        raise ValueError("duration %r out of range (1s to 30d)" % text)
    return seconds


def promql(seconds: float) -> str:
    """A PromQL range duration for ``seconds`` (whole seconds; 2.42 takes no fractions)."""
    return "%ds" % max(1, int(round(seconds)))


def human(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return "%ds" % seconds
    if seconds < 7200:
        return "%dm%02ds" % divmod(seconds, 60) if seconds % 60 else "%dm" % (seconds // 60)
    h, rest = divmod(seconds, 3600)
    return "%dh%02dm" % (h, rest // 60)
