"""Shared by the GPU tests (and the golden run, the live mixin test): GPU UUIDs of the
dcgm-exporter fixtures (tests/data/dcgm), the fixture reader and a real HTTP server
standing in for dcgm-exporter's /metrics."""
import http.server
import os
import threading

from tests.helpers import ROOT

FIXTURES = os.path.join(ROOT, "tests", "data", "dcgm")
# GPUs 0 and 1 of tests/data/dcgm/dcgm-exporter-k8s.txt
U0 = "GPU-5d4f7c1e-9a3b-2e81-6c0d-4b7e91a2f3c5"
U1 = "GPU-a1c93e07-44d2-8f6b-1e95-07c2d8b6e4f1"


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


class DcgmServer:
    """Serves ``body`` (mutable, or a function called per request) at ``url`` until closed."""

    def __init__(self, body):
        self.body = body
        srv = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = srv.body() if callable(srv.body) else srv.body  # a page that moves
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/metrics" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
