"""The Prometheus text format, byte for byte what ``prometheus_client.generate_latest``
writes for the same metric families, in about half its time.

Rendering /metrics was the scrape's bottleneck (256 ranks: ~6,000 lines). Most of
generate_latest's time goes into rebuilding every sample's label string: sorting the
labels, validating and escaping each name and value, on every scrape, although the same
label sets come back scrape after scrape. Here each label set's rendered text is kept
(keyed by the sample's labels as given) and only the value is formatted again.

What generate_latest does, and this mirrors (prometheus_client 0.17 to 0.26, default
``escaping``): counters get ``_total`` on their HELP and TYPE lines (the samples carry
their own names), info becomes a ``_info`` gauge, stateset a gauge, gaugehistogram a
histogram, unknown untyped; a family's ``_created``, ``_gsum`` and ``_gcount`` samples
go into a gauge of their own after it; HELP escapes ``\\`` and newline; label values
escape ``\\``, newline and ``"``; names outside the legacy character set have their
other characters replaced by ``_``; values as Go prints them (+Inf, -Inf, NaN, 1e+07);
timestamps in milliseconds. tests/agent/test_exposition.py holds it to that.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name

_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_SUFFIXES = ("_created", "_gsum", "_gcount")
_SPECIAL = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def value_text(v: Any) -> str:
    """prometheus_client.utils.floatToGoString, with one dict lookup for +Inf, -Inf and
    NaN instead of three comparisons."""
    d = float(v)
    s = repr(d)
    special = _SPECIAL.get(s)
    if special is not None:
        return special
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python (for le buckets)
        mantissa = "%s.%s%s" % (s[0], s[1:dot], s[dot + 1:])
        return "%se+%02d" % (mantissa.rstrip("0."), dot - 1)
    return s


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


SLACK = 1024  # label sets the cache may hold beyond twice a scrape's


class Exposition:
    """A renderer that remembers label text between scrapes. The label sets of ranks
    that have gone stay in it until ``settle()``, called after each whole scrape, finds
    it holding more than twice the samples that scrape rendered (plus SLACK) and starts
    it again: it stays within twice the live series, not at ``max_cached`` (200,000
    label sets, ~40 MB, reached by ranks that come and go: issue 14)."""

    def __init__(self, max_cached: int = 200_000) -> None:
        self.max_cached = max_cached
        self._prefixes: dict[tuple[Any, ...], str] = {}
        self._names: dict[str, str] = {}
        self._rendered = 0  # samples rendered since the last settle()

    def settle(self) -> None:
        """The end of a scrape: forget the label text of series no longer exported."""
        if len(self._prefixes) > 2 * self._rendered + SLACK:
            self._prefixes = {}
        self._rendered = 0

    def render(self, families: Iterable[Any]) -> bytes:
        """``families``: what a collector's ``collect()`` yields. An exception from any
        of them propagates, as from generate_latest (the caller drops that output)."""
        out: list[str] = []
        for metric in families:
            self._family(metric, out)
        return "".join(out).encode("utf-8")

    def _name(self, name: str) -> str:
        text = self._names.get(name)
        if text is None:
            text = self._names[name] = escape_metric_name(name)
        return text

    def _prefix(self, key: tuple[Any, ...], name: str, labels: dict[str, Any]) -> str:
        """A sample's name and label text, what comes before its value."""
        text = self._name(name)
        if labels:
            text += "{%s}" % ",".join(
                '%s="%s"' % (escape_label_name(k),
                             v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\""))
                for k, v in sorted(labels.items()))
        if len(self._prefixes) >= self.max_cached:
            self._prefixes = {}
        self._prefixes[key] = text + " "
        return text + " "

    def _family(self, metric: Any, out: list[str]) -> None:
        mname, mtype = metric.name, metric.type
        if mtype == "counter":
            mname += "_total"
        elif mtype == "info":
            mname += "_info"
        mtype = _TYPES.get(mtype, mtype)
        doc = _help(metric.documentation)
        shown = self._name(mname)
        out.append("# HELP %s %s\n# TYPE %s %s\n" % (shown, doc, shown, mtype))
        apart = {metric.name + suffix: suffix for suffix in _SUFFIXES}
        om: dict[str, list[str]] = {}
        prefixes = self._prefixes
        self._rendered += len(metric.samples)
        for name, labels, value, timestamp, *_ in metric.samples:
            # the hot loop (6,000 samples at 256 ranks): one lookup for name and labels,
            # the value's repr unless it is +Inf, -Inf, NaN or in need of an exponent
            key = (name, *labels.items())
            prefix = prefixes.get(key) or self._prefix(key, name, labels)
            d = float(value)
            text = repr(d)
            if text[-1] in "fn" or (d > 0 and text.find(".") > 6):
                text = value_text(d)
            if timestamp is not None:
                text += " %d" % int(float(timestamp) * 1000)
            line = prefix + text + "\n"
            suffix = apart.get(name)
            if suffix is None:
                out.append(line)
            else:
                om.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(om.items()):
            shown = self._name(metric.name + suffix)
            out.append("# HELP %s %s\n# TYPE %s gauge\n" % (shown, doc, shown))
            out.extend(lines)
