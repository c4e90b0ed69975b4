"""The agent's HTTP face: /metrics, /healthz and the versioned JSON API (/api/v1/...).

Routes are plain functions ``(agent, query) -> (status, body)``; other parts of the
agent add theirs with ``agent.add_route``. Bad parameters get a 400 with a reason.
"""
import json
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest


class ApiError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def one(query, name, default=None, convert=str):
    """One query parameter, converted, or ApiError(400)."""
    values = query.get(name)
    if not values:
        if default is ApiError:
            raise ApiError(400, "missing parameter %r" % name)
        return default
    if len(values) > 1:
        raise ApiError(400, "parameter %r given more than once" % name)
    try:
        return convert(values[0])
    except (TypeError, ValueError):
        raise ApiError(400, "parameter %r has a bad value %r" % (name, values[0][:64]))


def ranks_route(agent, query):
    unknown = set(query) - {"job", "pod", "namespace"}
    if unknown:
        raise ApiError(400, "unknown parameters: %s" % ", ".join(sorted(unknown)))
    match = {k: one(query, k) for k in query}
    now = time.monotonic()
    ranks = agent.table.find(**match)
    with agent.table.lock:
        body = [r.as_json(now) for r in ranks]
    body.sort(key=lambda r: (r["job"], r["rank"]))
    return 200, {"node": agent.table.node, "ranks": body}


def _positive(v):
    x = float(v)
    if not 0 < x <= 86400:
        raise ValueError(v)
    return x


def timeline_route(agent, query):
    unknown = set(query) - {"rank", "job", "pod", "seconds"}
    if unknown:
        raise ApiError(400, "unknown parameters: %s" % ", ".join(sorted(unknown)))
    rank = one(query, "rank", ApiError, int)
    seconds = one(query, "seconds", 60.0, _positive)
    match = {"rank": rank}
    for k in ("job", "pod"):
        if k in query:
            match[k] = one(query, k)
    found = agent.table.find(**match)
    if not found:
        raise ApiError(404, "no live rank matches %s" % match)
    if len(found) > 1:
        raise ApiError(400, "%d ranks match %s: add job= or pod=" % (len(found), match))
    r = found[0]
    events = agent.table.timeline(r, seconds)
    body = {"rank": r.ident, "seconds": seconds, "clock": "CLOCK_MONOTONIC ns",
            "clock_offset_ns": r.clock_offset_ns,
            "batches": [{"t_end_ns": e, "wait_ns": w, "interval_ns": i} for e, w, i in events]}
    for name, fn in agent.timeline_parts:
        body[name] = fn(r, seconds)
    return 200, body


class Handler(BaseHTTPRequestHandler):
    agent = None  # set on the subclass made by serve()
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: Prometheus scrapes every few seconds
        pass

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        try:
            if url.path == "/metrics":
                return self._send(200, generate_latest(self.agent.registry), CONTENT_TYPE_LATEST)
            if url.path == "/healthz":
                return self._send(200, b"ok\n", "text/plain")
            route = self.agent.routes.get(url.path)
            if route is None:
                raise ApiError(404, "no such endpoint %s" % url.path)
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            status, body = route(self.agent, query)
        except ApiError as e:
            status, body = e.status, {"error": e.message}
        except Exception as e:  # a bug in one route must not kill the server
            status, body = 500, {"error": "internal error: %s" % type(e).__name__}
        self._send(status, (json.dumps(body, indent=1, default=str) + "\n").encode(),
                   "application/json")

    def _send(self, status, data, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def parse_listen(addr):
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise ValueError("--listen must be HOST:PORT or :PORT, got %r" % addr)
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port)
    except ValueError:
        raise ValueError("--listen port must be a number, got %r" % addr)
    if not 0 <= port <= 65535:
        raise ValueError("--listen port out of range: %r" % addr)
    return host, port


def make_server(agent, addr):
    host, port = parse_listen(addr)
    handler = type("AgentHandler", (Handler,), {"agent": agent})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
