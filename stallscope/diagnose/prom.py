"""A small Prometheus HTTP API client: instant and range queries, label values.

Every call raises ``fetch.Unreachable`` (nothing answered at the URL) or
``fetch.HttpError`` (a bad query or a server error, with Prometheus' own reason).
"""
import math
import time

from . import fetch


def label(value):
    """A PromQL double-quoted string literal for a label value."""
    return '"%s"' % str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(**labels):
    """``{a="x",b="y"}`` for the labels whose value is not None."""
    return "{%s}" % ",".join("%s=%s" % (k, label(v)) for k, v in labels.items() if v is not None)


def number(text):
    v = float(text)
    return None if math.isnan(v) or math.isinf(v) else v


class Prometheus:
    def __init__(self, url, timeout=fetch.TIMEOUT, now=None):
        self.url = fetch.base_url(url)
        self.timeout = timeout
        self.now = time.time() if now is None else now  # one evaluation time for the report

    def _get(self, path, params):
        body = fetch.get_json(self.url + path, params, timeout=self.timeout)
        if body.get("status") != "success":
            raise fetch.HttpError(self.url + path, 200, body.get("error") or "query failed")
        return body["data"]

    def query(self, expr):
        """[(labels, value or None)] of an instant vector at ``now``."""
        data = self._get("/api/v1/query", {"query": expr, "time": "%.3f" % self.now})
        if data["resultType"] != "vector":
            raise fetch.HttpError(self.url, 200, "expected a vector from %s" % expr)
        return [(r["metric"], number(r["value"][1])) for r in data["result"]]

    def scalar(self, expr):
        """The single value of ``expr`` or None when it returned nothing (or NaN)."""
        rows = self.query(expr)
        return rows[0][1] if rows else None

    def query_range(self, expr, start, end, step):
        """[(labels, [(t, value or None)])]."""
        data = self._get("/api/v1/query_range", {
            "query": expr, "start": "%.3f" % start, "end": "%.3f" % end, "step": "%.3f" % step})
        return [(r["metric"], [(float(t), number(v)) for t, v in r["values"]])
                for r in data["result"]]

    def label_values(self, name, match=None):
        params = {}
        if match:
            params["match[]"] = match
        return self._get("/api/v1/label/%s/values" % name, params)

    def series(self, match, start=None):
        params = {"match[]": match}
        if start is not None:
            params["start"] = "%.3f" % start
        return self._get("/api/v1/series", params)
