"""The agent's HTTP face: /metrics, /healthz and the versioned JSON API (/api/v1/...).

Routes are plain functions ``(query) -> (status, body)`` from api.py and the parts;
bad parameters get a 400 with a reason.
"""
from __future__ import annotations

import json
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..host import ApiError


class Handler(BaseHTTPRequestHandler):
    render: Callable[[], bytes] = staticmethod(lambda: b"")  # set by make_server()
    routes: dict[str, Callable[..., tuple[int, Any]]] = {}
    healthy: Callable[[], tuple[bool, str]] = staticmethod(lambda: (True, "ok"))
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes every few seconds
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        try:
            if url.path == "/metrics":
                return self._send(200, self.render(), CONTENT_TYPE_LATEST)
            if url.path == "/healthz":
                ok, text = self.healthy()
                return self._send(200 if ok else 503, (text + "\n").encode(), "text/plain")
            route = self.routes.get(url.path)
            if route is None:
                raise ApiError(404, "no such endpoint %s" % url.path)
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            status, body = route(query)
        except ApiError as e:
            status, body = e.status, {"error": e.message}
        except Exception as e:  # a bug in one route must not kill the server
            status, body = 500, {"error": "internal error: %s" % type(e).__name__}
        self._send(status, (json.dumps(body, indent=1, default=str) + "\n").encode(),
                   "application/json")

    def _send(self, status: int, data: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def parse_listen(addr: str) -> tuple[str, int]:
    host, sep, port_text = addr.rpartition(":")
    if not sep:
        raise ValueError("--listen must be HOST:PORT or :PORT, got %r" % addr)
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError("--listen port must be a number, got %r" % addr) from None
    if not 0 <= port <= 65535:
        raise ValueError("--listen port out of range: %r" % addr)
    return host, port


def make_server(addr: str, render: Callable[[], bytes], routes: dict[str, Any],
                healthy: Callable[[], tuple[bool, str]]) -> ThreadingHTTPServer:
    host, port = parse_listen(addr)
    handler = type("AgentHandler", (Handler,), {"render": staticmethod(render), "routes": routes,
                                                 "healthy": staticmethod(healthy)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
