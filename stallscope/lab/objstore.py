"""A tiny HTTP object store with injected latency, the lab's slow tier:
``python -m stallscope.lab.objstore DIR PORT [--latency S]``.

Serves the files of DIR (``GET /<name>``, with ``Range: bytes=a-b``) after sleeping
``--latency`` seconds per request, as a remote object store's first-byte latency.
No root, no FUSE: the cold-cache scenario runs anywhere.
"""
import argparse
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def handler(root, latency):
    class ObjectHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            time.sleep(latency)
            name = os.path.basename(self.path.split("?", 1)[0])
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                return self._send(404, b"no such object\n")
            m = _RANGE.match(self.headers.get("Range", ""))
            if m:
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else len(data) - 1
                return self._send(206, data[start:end + 1])
            return self._send(200, data)

        def _send(self, status, body):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            self.wfile.write(body)

    return ObjectHandler


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.objstore")
    p.add_argument("root")
    p.add_argument("port", type=int)
    p.add_argument("--latency", type=float, default=0.05)
    a = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), handler(a.root, a.latency))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
