"""A small Prometheus HTTP API client: instant and range queries, label values.

Every call raises ``fetch.Unreachable`` (nothing answered at the URL) or
``fetch.HttpError`` (a bad query or a server error, with Prometheus' own reason).
"""
from __future__ import annotations

import math
import time
from typing import Any

from . import fetch


def label(value: object) -> str:
    """A PromQL double-quoted string literal for a label value."""
    return '"%s"' % str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(**labels: str | None) -> str:
    """``{a="x",b="y"}`` for the labels whose value is not None."""
    return "{%s}" % ",".join("%s=%s" % (k, label(v)) for k, v in labels.items() if v is not None)


def number(text: str | float) -> float | None:
    v = float(text)
    return None if math.isnan(v) or math.isinf(v) else v


class Prometheus:
    def __init__(self, url: str, timeout: float = fetch.TIMEOUT, now: float | None = None) -> None:
        self.url = fetch.base_url(url)
        self.timeout = timeout
        self.now = time.time() if now is None else now  # one evaluation time for the report

    def _get(self, path: str, params: dict[str, str]) -> Any:
        """The ``data`` of a successful answer (JSON: its shape depends on the endpoint)."""
        body = fetch.get_json(self.url + path, params, timeout=self.timeout)
        if body.get("status") != "success":
            raise fetch.HttpError(self.url + path, 200, body.get("error") or "query failed")
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float | None]]:
        """[(labels, value or None)] of an instant vector at ``now``."""
        data = self._get("/api/v1/query", {"query": expr, "time": "%.3f" % self.now})
        if data["resultType"] != "vector":
            raise fetch.HttpError(self.url, 200, "expected a vector from %s" % expr)
        return [(r["metric"], number(r["value"][1])) for r in data["result"]]

    def samples(self, expr: str) -> list[tuple[dict[str, str], list[tuple[float, float | None]]]]:
        """[(labels, [(t, value)])] of a range vector selector at ``now``: each series' raw
        samples with their own timestamps."""
        data = self._get("/api/v1/query", {"query": expr, "time": "%.3f" % self.now})
        if data["resultType"] != "matrix":
            raise fetch.HttpError(self.url, 200, "expected a matrix from %s" % expr)
        return [(r["metric"], [(float(t), number(v)) for t, v in r["values"]]) for r in data["result"]]

    def scalar(self, expr: str) -> float | None:
        """The single value of ``expr`` or None when it returned nothing (or NaN)."""
        rows = self.query(expr)
        return rows[0][1] if rows else None

    def query_range(self, expr: str, start: float, end: float,
                    step: float) -> list[tuple[dict[str, str], list[tuple[float, float | None]]]]:
        """[(labels, [(t, value or None)])]. ``nocache=1``: VictoriaMetrics otherwise moves
        the start and end of a query of 50 points or more to multiples of the step (for
        its response cache), so the last point may fall up to a step before ``end``: a
        7-day report at 840 s steps found no sample of a job of the last few minutes
        (benchmarks/scale, issue 36). Prometheus ignores the parameter."""
        data = self._get("/api/v1/query_range", {
            "query": expr, "start": "%.3f" % start, "end": "%.3f" % end, "step": "%.3f" % step,
            "nocache": "1"})
        return [(r["metric"], [(float(t), number(v)) for t, v in r["values"]])
                for r in data["result"]]

    def label_values(self, name: str, match: str | None = None) -> list[str]:
        params = {}
        if match:
            params["match[]"] = match
        values: list[str] = self._get("/api/v1/label/%s/values" % name, params)
        return values

    def series(self, match: str, start: float | None = None,
               end: float | None = None) -> list[dict[str, str]]:
        """The series ``match`` selects with samples between ``start`` and ``end`` (by
        default all Prometheus holds); Prometheus answers at the granularity of its blocks
        (2 h), so a series may be listed for a range a little before or after its samples."""
        params = {"match[]": match}
        if start is not None:
            params["start"] = "%.3f" % start
        if end is not None:
            params["end"] = "%.3f" % end
        found: list[dict[str, str]] = self._get("/api/v1/series", params)
        return found
