"""promtool unit tests derived from the vocabulary: for a cause alert (a ``CauseAlert`` in
stallscope/vocabulary/causes.py), the input series and the expected alert follow from
its signal's PromQL face (``Signal.query``), its comparison and line, the mixin config's
``cause_for`` and the alert's summary and description, so a new cause alert needs no
hand-written case (issue 29).

The derived case, at the line and at the ``for:`` boundary:

- pod train-0 has a waiting rank (5 % of its step time) and the signal just past the
  line (2 % of the line beyond it): it fires, with the labels the query keeps plus the
  pod's job and node, and the annotations rendered from the vocabulary's text;
- pod train-1 has a waiting rank and the signal just before the line: no alert (a
  threshold moved in the rules, either way, fails the case);
- pod train-2 has its signal far past the line but no waiting rank (1 %, below the
  data-wait line): no alert (the waiting-rank gate);
- a node-level series (no pod) far past the line: no alert.

The ranks report from one rate window on, so the condition turns true at once at the
minute after (the signal's rates by then cover a whole window); promtool must see no
alert one evaluation before that minute plus ``for:`` and the alert at it (a ``for:``
changed in the rules, either way, fails).

The series are solved from the shape of the query (``solve``): a gauge, a counter's rate,
a ratio of two of those (a numerator that is a matcher's share of the denominator, as
the cache's misses of its lookups, included) or a histogram quantile over the metric's
declared buckets, each label matcher (``=``, ``!=``, ``=~``, ``!~``) given a value that
matches it. The annotations are rendered as Prometheus renders them (``render``: labels,
the value, ``humanize``, ``humanize1024``, ``humanizePercentage``, ``humanizeDuration`` at
any line, ``printf``). What it cannot read raises ``CannotDerive`` saying what, and
tests/mixin/test_promtool.py prints it: extend the derivation (or the entry), rather than
hand-writing the case.
"""
from __future__ import annotations

import dataclasses
import math
import re

from stallscope import vocabulary

INSTANCE = "10.0.0.1:9478"
NODE = "n1"
NAMESPACE = "ml"
JOB = "train"
STEP = 60            # seconds per sample (the tests' interval: 1m)
SAMPLES = 40         # minutes of series
NEAR = 0.02          # "just past" / "just before": 2 % of the line from it
WAITING = 3.0        # a waiting rank: 3 s of every 60 s of steps waits (5 %)
CALM = 0.6           # a rank below the data-wait line (1 %)
# Realistic values for the labels a metric declares (any other label gets "<label>-a").
EXAMPLE = {"container": "trainer", "mountpoint": "/data", "fstype": "fuse.s3fs", "driver": "s3fs",
           "tier": "remote"}
HOOK_LABELS = ("job", "rank", "pod", "namespace", "node")


class CannotDerive(Exception):
    """The alert's query or text has a shape the derivation does not read (says which)."""


@dataclasses.dataclass(frozen=True)
class Case:
    series: list[tuple[str, str]]                    # (series selector, promtool values)
    t_true: int                                      # minute the condition turns true
    expected: list[tuple[dict[str, str], str, str]]  # (labels, summary, description)


def sel(metric: str, **labels: str) -> str:
    return "%s{%s}" % (metric, ",".join('%s="%s"' % kv for kv in sorted(labels.items())))


def rank(r: int, wait_per_min: float, job: str = JOB, pod: str | None = None,
         steps_per_min: float = 600, start: int = 0) -> list[tuple[str, str]]:
    """A rank's hook series: 60 s of steps per minute, ``wait_per_min`` of them waiting;
    reporting from minute ``start`` on."""
    labels = dict(job=job, rank=str(r), pod=pod or "%s-%d" % (job, r), namespace=NAMESPACE, node=NODE,
                  instance=INSTANCE)
    missing = "_x%d " % start if start else ""
    n = SAMPLES - start
    return [(sel("stallscope_data_wait_seconds_sum", **labels), missing + "0+%gx%d" % (wait_per_min, n)),
            (sel("stallscope_step_seconds_sum", **labels),
             missing + "0+%gx%d" % (60 if steps_per_min else 0, n)),
            (sel("stallscope_step_seconds_count", **labels), missing + "0+%gx%d" % (steps_per_min, n))]


def minutes(duration: str) -> int:
    m = re.fullmatch(r"(\d+)m", duration)
    if not m:
        raise CannotDerive("a duration in whole minutes, got %r" % duration)
    return int(m.group(1))


def num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


# -- Prometheus' template functions (template/template.go), for the expected text ------
def go_float(v: float) -> str:
    """A float as Go's ``%v`` (strconv 'g', shortest) writes it: ``{{ $value }}``."""
    v = float(v)
    if v != v or v in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(v)]
    if v == 0:
        return "0"
    sign, digits, exp = __import__("decimal").Decimal(repr(v)).normalize().as_tuple()
    d = "".join(map(str, digits))
    nd, dp = len(d), len(d) + exp           # digits, and where the point goes in them
    e = dp - 1
    if e < -4 or e >= 6:  # strconv: the shortest digits decide with a precision of 6
        out = d[0] + ("." + d[1:] if nd > 1 else "") + "e%s%02d" % ("-" if e < 0 else "+", abs(e))
    elif dp <= 0:
        out = "0." + "0" * -dp + d
    elif dp >= nd:
        out = d + "0" * (dp - nd)
    else:
        out = d[:dp] + "." + d[dp:]
    return ("-" if sign else "") + out


def _g4(v: float) -> str:
    """Go's ``%.4g`` (as C's, which Python's is)."""
    return "%.4g" % v


def humanize(v: float) -> str:
    if v == 0 or v != v or v in (float("inf"), float("-inf")):
        return _g4(v)
    if abs(v) >= 1:
        prefix = ""
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _g4(v) + prefix
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _g4(v) + prefix


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or v != v or v in (float("inf"), float("-inf")):
        return _g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return _g4(v) + prefix


def humanize_percentage(v: float) -> str:
    return "%.4g%%" % (v * 100)


def humanize_duration(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return _g4(v)
    if v == 0:
        return "0s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        whole = int(v)
        seconds, minutes, hours, days = whole % 60, whole // 60 % 60, whole // 3600 % 24, whole // 86400
        # from minutes up, whole seconds
        if days:
            return "%s%dd %dh %dm %ds" % (sign, days, hours, minutes, seconds)
        if hours:
            return "%s%dh %dm %ds" % (sign, hours, minutes, seconds)
        if minutes:
            return "%s%dm %ds" % (sign, minutes, seconds)
        return "%s%.4gs" % (sign, v)
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return "%.4g%ss" % (v, prefix)


FILTERS = {"humanize": humanize, "humanize1024": humanize1024,
           "humanizePercentage": humanize_percentage, "humanizeDuration": humanize_duration}
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_PRINTF = re.compile(r'printf\s+"(%[-+ 0#]*\d*(?:\.\d+)?[dfeEgGs])"')


def _action(body: str, labels: dict[str, str], value: float) -> str:
    """One ``{{ ... }}`` of an annotation: a label, the value, the value through a
    pipeline of humanize functions or a printf of it."""
    m = re.fullmatch(r"\$labels\.(\w+)", body)
    if m:
        if m.group(1) not in labels:
            raise CannotDerive("the alert has no label %s for {{ %s }}" % (m.group(1), body))
        return labels[m.group(1)]
    stages = [x.strip() for x in body.split("|")]
    printf = _PRINTF.fullmatch(stages[0].replace(" $value", "").strip()) if stages[0].startswith("printf") \
        and stages[0].endswith("$value") else None
    if stages[0] != "$value" and printf is None:
        raise CannotDerive("a template action the derivation does not render: {{ %s }}" % body)
    out: float | str = value
    if printf is not None:
        out = _go_printf(printf.group(1), value)
    for f in stages[1:]:
        p = _PRINTF.fullmatch(f)
        if p is not None and not isinstance(out, str):
            out = _go_printf(p.group(1), out)
        elif f in FILTERS and not isinstance(out, str):
            out = FILTERS[f](out)
        else:
            raise CannotDerive("a template function the derivation does not render: %s in {{ %s }}"
                               % (f, body))
    return out if isinstance(out, str) else go_float(out)


def _go_printf(fmt: str, v: float) -> str:
    if fmt.endswith("d"):
        raise CannotDerive("printf %s of a float: Go writes %%!d(float64=...)" % fmt)
    if fmt.endswith("s"):
        return go_float(v)
    return fmt % v


def render(template: str, labels: dict[str, str], value: float) -> str:
    """Go's text/template as Prometheus' alert annotations use it (labels, the value,
    the humanize functions, printf); anything else raises."""
    return _ACTION.sub(lambda m: _action(m.group(1), labels, value), template)


def line_text(signal: str, line: float) -> str:
    """<line> in a description, as the signal's unit writes it (a ratio in %, seconds
    with "s", a count rate with "/s" ...)."""
    return vocabulary.unit_text(vocabulary.signal(signal).unit, line)


# -- series that make a query equal a value ----------------------------------------------
_TERM = re.compile(r"(rate\()?(stallscope_[a-z_]+)\{([^}]*)\}(\[\$w\]\))?")
_QUANTILE = re.compile(r"histogram_quantile\(([0-9.]+), sum by \(([^)]*)\) "
                       r"\(rate\((stallscope_[a-z_]+)_bucket\{([^}]*)\}\[\$w\]\)\)\)")


@dataclasses.dataclass(frozen=True)
class Matcher:
    """One label matcher of a query: ``=``, ``!=``, ``=~`` or ``!~`` against ``value``."""
    op: str
    value: str

    def ok(self, v: str) -> bool:
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = re.fullmatch(self.value, v) is not None  # PromQL's regexes are anchored
        return hit if self.op == "=~" else not hit

    def pick(self, label: str, default: str | None) -> str | None:
        """A value of ``label`` that matches: ``default`` where it does (None: leave the
        label as the agent would set it), else one made to match."""
        if default is not None and self.ok(default):
            return None
        if self.op == "=":
            return self.value
        alternatives = [a for a in self.value.split("|") if re.escape(a) == a]
        tries = ((default or label) + "-x", "%s-a" % label) if self.op in ("!=", "!~") else \
            tuple(alternatives) + (EXAMPLE.get(label, ""),)
        for v in tries:
            if v and self.ok(v):
                return v
        raise CannotDerive("no value of label %s found that matches %s%s%r" % (
            label, label, self.op, self.value))


def _matchers(text: str) -> dict[str, Matcher]:
    """{label: its matcher} of a query's matchers (``$sel``, the config's, left out)."""
    out: dict[str, Matcher] = {}
    for m in (x.strip() for x in text.split(",")):
        if m in ("", "$sel"):
            continue
        got = re.fullmatch(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', m)
        if not got:
            raise CannotDerive("matcher %r" % m)
        label, op, value = got.groups()
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as e:
                raise CannotDerive("matcher %r: %s" % (m, e)) from None
        out[label] = Matcher(op, value)
    return out


def _labels(metric: str, pod: str | None, required: dict[str, Matcher]) -> dict[str, str]:
    """The labels the agent puts on ``metric`` for ``pod`` (None: a node-level series),
    with the values the query's matchers pick."""
    base = {"namespace": NAMESPACE, "pod": pod, "job": JOB, "node": NODE}
    out = {"instance": INSTANCE}
    for label in vocabulary.metric(metric).labels:
        if pod is None and label not in ("node",):
            continue
        out[label] = base.get(label) or EXAMPLE.get(label, "%s-a" % label)
    for label, matcher in required.items():
        if label not in out and matcher.op != "=":
            continue  # absent: "" in PromQL, which a node-level series keeps so (pod!="")
        value = matcher.pick(label, out.get(label))
        if value is not None:
            out[label] = value
    return out


def _values(is_rate: bool, v: float) -> str:
    """A gauge at ``v``, or a counter rising ``v`` per second."""
    return "%s+%sx%d" % ("1000" if is_rate else num(v), num(v * STEP) if is_rate else "0", SAMPLES)


@dataclasses.dataclass(frozen=True)
class Solved:
    series: list[tuple[str, str]]
    value: float                  # what the query gives for them
    labels: dict[str, str]        # the labels of its result


def _bucket_counts(metric: str, q: float, v: float, total: int) -> tuple[dict[str, int], float]:
    """Per-minute cumulative bucket counts whose ``q`` quantile is ``v`` or just past it
    (the histogram_quantile interpolation), and that quantile."""
    bounds = list(vocabulary.metric(metric).buckets)
    lo = 0.0
    for hi in bounds:
        if lo < v <= hi:
            break
        lo = hi
    else:
        raise CannotDerive("%s: %r is past the last finite bucket" % (metric, v))
    if lo == 0.0:
        raise CannotDerive("%s: %r is in the first bucket" % (metric, v))
    r = (v - lo) / (hi - lo)
    below = math.floor((q - r) * total / (1 - r))   # observations at or under lo
    value = lo + (hi - lo) * (q * total - below) / (total - below)
    cum = {}
    for b in bounds:
        cum[num(b)] = below if b <= lo else total
    cum["+Inf"] = total
    return cum, value


def solve(signal: str, v: float, pod: str | None) -> Solved:
    """Series of ``pod`` for which ``signal``'s query gives ``v`` (a histogram quantile:
    the nearest value at or past it)."""
    s = vocabulary.signal(signal)
    q = " ".join(s.query.split())
    if not q:
        raise CannotDerive("signal %s has no query" % signal)
    m = _QUANTILE.fullmatch(q)
    if m:
        quantile, by, metric, mat = float(m.group(1)), m.group(2), m.group(3), _matchers(m.group(4))
        cum, value = _bucket_counts(metric, quantile, v, 600000)
        labels = _labels(metric, pod, mat)
        series = [(sel(metric + "_bucket", le=le, **labels), "0+%dx%d" % (n, SAMPLES))
                  for le, n in cum.items()]
        return Solved(series, value, {k: labels[k] for k in by.split(", ") if k in labels})
    terms = [(bool(t[0]), t[1], _matchers(t[2]), bool(t[3])) for t in _TERM.findall(q)]
    if any(is_rate != closed for is_rate, _m, _x, closed in terms):
        raise CannotDerive("a rate() the solver cannot read in %r" % q)
    rest = _TERM.sub("T", q)
    by = set(re.findall(r"\b(?:sum|max|min|avg) by \(([^)]*)\)", rest))
    shape = re.sub(r"\b(?:sum|max|min|avg) by \([^)]*\)", "A", rest).replace(" ", "")
    if len(by) > 1:
        raise CannotDerive("aggregations by different labels in %r" % q)
    keep = by.pop().split(", ") if by else None

    def kept(labels: dict[str, str]) -> dict[str, str]:
        return dict(labels) if keep is None else {k: labels[k] for k in keep if k in labels}

    if shape in ("T", "A(T)") and len(terms) == 1:
        is_rate, metric, mat, _ = terms[0]
        labels = _labels(metric, pod, mat)
        return Solved([(sel(metric, **labels), _values(is_rate, v))], v, kept(labels))
    if shape in ("T/T", "A(T)/A(T)", "A(T/T)") and len(terms) == 2:
        (r1, m1, x1, _), (r2, m2, x2, _) = terms
        if r1 != r2:
            raise CannotDerive("a ratio of a rate and a gauge in %r" % q)
        if m1 == m2:  # the numerator is the share of the denominator its matchers pick
            extra = {k: x.value for k, x in x1.items() if x.op == "=" and x2.get(k) != x}
            if len(extra) != 1 or not r1:
                raise CannotDerive("a share by %r in %r" % (extra, q))
            (label, value), = extra.items()
            share = _labels(m1, pod, x1)
            other = dict(share, **{label: "not_" + value})
            return Solved([(sel(m1, **share), _values(True, v)), (sel(m1, **other), _values(True, 1 - v))],
                          v, kept(share))
        scale = 10.0 if r1 else 1000.0  # e.g. 10 CFS periods a second, 1000 bytes of /dev/shm
        a, b = _labels(m1, pod, x1), _labels(m2, pod, x2)
        return Solved([(sel(m1, **a), _values(r1, v * scale)), (sel(m2, **b), _values(r2, scale))],
                      v, kept(dict(a, **b)))
    raise CannotDerive("query shape %s of %r" % (shape, q))


# -- the case ----------------------------------------------------------------------------
def _sides(op: str, line: float, unit: str) -> tuple[float, float, float]:
    """(just past the line, just before it, far past it) for ``signal op line``."""
    d = NEAR * (abs(line) or 1.0)
    top = 1.0 if unit == "ratio" else None
    if op in (">", ">="):
        far = (line + top) / 2 if top is not None else line * 2 + 1
        return line + d, line - d, far
    if op in ("<", "<="):
        return line - d, line + d, line / 2 if line > 0 else line - 1
    if op == "==":
        return line, line + 1, line
    raise CannotDerive("comparison %s" % op)


def cause_case(cfg, name: str) -> Case:
    """The derived case of cause alert ``name`` under mixin config ``cfg``."""
    known = vocabulary.cause_alerts()
    if name not in known:
        raise CannotDerive("%s is not a cause alert of the vocabulary" % name)
    _cause, a = known[name]
    line = cfg.line(name)
    unit = vocabulary.signal(a.signal).unit
    past, before, far = _sides(a.op, line, unit)
    fires = solve(a.signal, past, "train-0")
    # The ranks report from one rate window on: by then a rate of the signal's series
    # covers its whole window (earlier, rate() extrapolates a partial one and reads low),
    # so the condition turns true at once, when the first rank ratio exists.
    w = minutes(cfg.rate_window)
    series = rank(0, WAITING, start=w) + rank(1, WAITING, start=w) + rank(2, CALM, start=w)
    series += fires.series + solve(a.signal, before, "train-1").series
    series += solve(a.signal, far, "train-2").series + solve(a.signal, far, None).series
    labels = dict(fires.labels, job=JOB, node=NODE)
    where = "pod %s/%s (job %s, node %s)" % (NAMESPACE, labels["pod"], JOB, NODE)
    description = (a.description.replace("<where>", where).replace("<window>", cfg.rate_window)
                   .replace("<line>", line_text(a.signal, line)))
    waiting = " Waiting ranks in the pod: rank 0 waits %s." % humanize_percentage(WAITING / 60)
    return Case(series, w + 1, [(labels, render(a.summary, labels, fires.value),
                             render(description, labels, fires.value) + waiting)])
