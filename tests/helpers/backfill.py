"""A history for Prometheus made of recorded lab runs (issue 36): record a real Prometheus'
raw samples over a short window, lay recordings end to end (a recording shorter than its
phase repeats, its counters carried on, not reset), shift the whole hours into the past,
write it as OpenMetrics and load it with ``promtool tsdb create-blocks-from openmetrics``
into a fresh data directory that a second, real Prometheus serves.

What a phase holds is what the lab measured: nothing here makes up a value. A phase may
present one pod's recording under another pod's name (a healthy job's hour as the hour
before the stalled job stalled), which is why ``Recording.as_pod`` exists.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import urllib.parse

from stallscope.processes import servers

Key = tuple[tuple[str, str], ...]  # a series' labels, sorted, __name__ included
# the labels that say which pod a series is about and where it ran
IDENTITY = ("job", "pod", "rank", "node", "instance", "container", "gpu", "uuid")


def _get(url: str, path: str, params: dict[str, str]):
    body = json.loads(servers.http_get(url + path + "?" + urllib.parse.urlencode(params)))
    if body.get("status") != "success":
        raise RuntimeError("%s %s: %s" % (path, params, body))
    return body["data"]


def counter_names(url: str) -> set[str]:
    """The names whose values only grow (counters, histogram and summary parts) from the
    scraped metadata; recorded series have none and are gauges (a rate is one)."""
    names = set()
    for family, metas in _get(url, "/api/v1/metadata", {}).items():
        kind = metas[0]["type"]
        if kind == "counter":
            names.add(family if family.endswith("_total") else family + "_total")
            names.add(family)
        elif kind in ("histogram", "summary"):
            names.update(family + s for s in ("_bucket", "_count", "_sum"))
    return names


@dataclasses.dataclass(frozen=True)
class Recording:
    """Every series matched, one value per ``step`` from ``start`` for ``length`` seconds
    (the last raw sample at or before each point, as an instant query would read it), and
    the value one step past the end (what the counters grew by over the recording)."""
    step: float
    length: float
    points: dict[Key, list[float | None]]   # len == length / step + 1
    counters: frozenset[str]

    def identity(self, pod: str) -> dict[str, str]:
        """The labels that name ``pod`` and where it runs, as its series carry them."""
        found: dict[str, str] = {}
        for key in self.points:
            labels = dict(key)
            if labels.get("pod") == pod:
                found.update((k, v) for k, v in labels.items() if k in IDENTITY)
        return found

    def as_pod(self, src: str, dst: str, dst_identity: dict[str, str]) -> Recording:
        """Pod ``src``'s series under pod ``dst``'s names (``dst_identity``: its job, rank,
        node, agent, cgroup, accelerator); the other series as they are."""
        src_identity = self.identity(src)
        if not src_identity:
            raise ValueError("no series of pod %s recorded" % src)

        def move(key: Key) -> Key:
            labels = dict(key)
            if labels.get("pod") != src:
                return key
            for k, v in src_identity.items():
                if labels.get(k) == v and k in dst_identity:
                    labels[k] = dst_identity[k]
            labels["pod"] = dst
            return tuple(sorted(labels.items()))
        return dataclasses.replace(self, points={move(k): p for k, p in self.points.items()})

    def only(self, keep) -> Recording:
        """The series whose labels (a dict) ``keep`` accepts."""
        return dataclasses.replace(self, points={k: p for k, p in self.points.items() if keep(dict(k))})


def record(url: str, match: str, end: float, length: float, step: float) -> Recording:
    """The series ``match`` selects over the ``length`` seconds before ``end`` (minus one
    step, kept for the counters' growth), from Prometheus at ``url``: raw samples, read by
    an instant query of a range selector (no resampling by Prometheus)."""
    start = end - length - step
    rows = _get(url, "/api/v1/query", {"query": "%s[%ds]" % (match, int(length + 2 * step)),
                                       "time": "%.3f" % end})["result"]
    n = int(round(length / step)) + 1
    points = {}
    for row in rows:
        raw = [(float(t), float(v)) for t, v in row["values"]]
        column: list[float | None] = []
        for i in range(n):
            at = start + i * step
            before = [v for t, v in raw if t <= at]
            column.append(before[-1] if before else None)
        points[tuple(sorted(row["metric"].items()))] = column
    return Recording(step, length, points, frozenset(counter_names(url)))


def replay(phases: list[tuple[Recording, float]], start: float) -> dict[Key, list[tuple[float, float]]]:
    """The phases end to end from ``start``: each recording repeated until its phase's
    duration is filled. A counter continues from where it stood (its next value one
    step's growth past the last), so it never resets at a seam; a gauge is as recorded."""
    out: dict[Key, list[tuple[float, float]]] = {}
    t0 = start
    for rec, duration in phases:
        per = int(round(rec.length / rec.step))
        for key, column in rec.points.items():
            counter = dict(key)["__name__"] in rec.counters
            known = [i for i, v in enumerate(column) if v is not None]
            if not known:
                continue
            # what the series grew by over one recording (from its first to its last point
            # where it began or ended inside the recording)
            first, last = known[0], known[-1]
            grew = (column[last] - column[first]) * per / (last - first) if last > first else 0.0
            samples = out.setdefault(key, [])
            base = 0.0
            if counter:
                # carry on from the series' last value, one average step's growth on
                base = (samples[-1][1] + grew / per - column[first]) if samples else 0.0
            for i in range(int(round(duration / rec.step))):
                tile, j = divmod(i, per)
                v = column[j]
                if v is None:
                    continue
                samples.append((t0 + i * rec.step, v + (base + tile * grew if counter else 0.0)))
        t0 += duration
    return out


def _labels(key: Key) -> tuple[str, str]:
    name = dict(key)["__name__"]
    rest = ",".join('%s="%s"' % (k, v.replace("\\", "\\\\").replace('"', '\\"'))
                    for k, v in key if k != "__name__")
    return name, "{%s}" % rest if rest else ""


def write_openmetrics(series: dict[Key, list[tuple[float, float]]], path: str) -> int:
    """``series`` as an OpenMetrics text (untyped samples, timestamps in seconds); returns
    the number of samples written."""
    n = 0
    with open(path, "w") as f:
        for key in sorted(series):
            name, labels = _labels(key)
            for t, v in series[key]:
                f.write("%s%s %r %.3f\n" % (name, labels, v, t))
                n += 1
        f.write("# EOF\n")
    return n


def serve(series: dict[Key, list[tuple[float, float]]], workdir: str) -> servers.PrometheusProcess:
    """A real Prometheus holding ``series`` and nothing else (it scrapes no target):
    the blocks made by promtool in its data directory before it starts."""
    os.makedirs(workdir)  # a fresh one: blocks of an earlier history would overlap this one
    text = os.path.join(workdir, "history.om")
    write_openmetrics(series, text)
    data = os.path.join(workdir, "data")
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", text, data],
                   check=True, capture_output=True, timeout=300)
    return servers.PrometheusProcess([], workdir=workdir).start()
