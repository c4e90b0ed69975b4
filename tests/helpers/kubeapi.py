"""A fake Kubernetes API server for the agent's pod identity (stallscope/agent/identity/kubepods.py),
speaking the real wire format of the pods endpoint (Kubernetes API reference, Pod v1:
"list or watch objects of kind Pod"; API concepts, "Efficient detection of changes"):

- ``GET /api/v1/pods?fieldSelector=spec.nodeName=N[&limit&continue]``: a ``PodList``
  (``kind``, ``apiVersion``, ``metadata.resourceVersion`` and ``continue``, ``items``),
  paged at ``limit``;
- ``...&watch=true&resourceVersion=RV[&allowWatchBookmarks=true][&timeoutSeconds=S]``:
  ``200`` with ``Transfer-Encoding: chunked``, one JSON ``{"type", "object"}`` per line
  (ADDED, MODIFIED, DELETED, BOOKMARK, and ERROR carrying a ``Status`` with code 410
  when the version is too old);
- a ``Status`` object with ``401`` without the bearer token, ``503`` while ``down``;

over TLS with a self-signed certificate for 127.0.0.1 (``ca``) made by openssl.
"""
import http.server
import json
import os
import queue
import shutil
import ssl
import subprocess
import threading
import urllib.parse

import pytest


def make_cert(directory, name="fake-apiserver"):
    """(cert, key) paths of a self-signed certificate valid for IP 127.0.0.1."""
    if not shutil.which("openssl"):
        pytest.skip("needs openssl")
    cert, key = os.path.join(directory, name + ".crt"), os.path.join(directory, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", key, "-out", cert, "-subj", "/CN=" + name,
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


def pod(uid, namespace, name, node):
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "t"}]},
            "status": {"phase": "Running"}}


def status(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeApiServer:
    def __init__(self, directory, token="fake-token"):
        self.ca, key = make_cert(directory)
        self.token = token
        self.token_file = os.path.join(directory, "token")
        with open(self.token_file, "w") as f:
            f.write(token + "\n")
        self.pods = {}            # uid -> Pod object (without kind/apiVersion, as in a list)
        self.version = 100
        self.requests = []        # (query dict, Authorization header)
        self.down = False
        self.watches = []         # queues of events for the open watches
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.handle(self)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = "https://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.set_down(True)
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- what a test changes -------------------------------------------------------------
    def add(self, uid, namespace, name, node):
        with self.lock:
            self.version += 1
            obj = pod(uid, namespace, name, node)
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.pods[uid] = obj
            self._event("ADDED", obj)

    def delete(self, uid):
        with self.lock:
            self.version += 1
            obj = self.pods.pop(uid)
            obj["metadata"]["resourceVersion"] = str(self.version)
            self._event("DELETED", obj)

    def set_down(self, down):
        with self.lock:
            self.down = down
            if down:
                for q, _node in self.watches:
                    q.put(None)  # the streams end

    def _event(self, kind, obj):
        for q, node in self.watches:
            if node is None or obj["spec"]["nodeName"] == node:
                q.put({"type": kind, "object": dict(obj, kind="Pod", apiVersion="v1")})

    # -- the endpoint --------------------------------------------------------------------
    def _send(self, h, code, doc):
        body = json.dumps(doc).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h):
        url = urllib.parse.urlsplit(h.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        self.requests.append((url.path, q, h.headers.get("Authorization")))
        if self.down:
            return self._send(h, 503, status(503, "ServiceUnavailable", "the server is down"))
        if h.headers.get("Authorization") != "Bearer " + self.token:
            return self._send(h, 401, status(401, "Unauthorized", "Unauthorized"))
        if url.path != "/api/v1/pods":
            return self._send(h, 404, status(404, "NotFound", "the server could not find the resource"))
        node = None
        selector = q.get("fieldSelector", "")
        if selector:
            field, _, value = selector.partition("=")
            if field != "spec.nodeName":
                return self._send(h, 400, status(400, "BadRequest", "field label not supported: " + field))
            node = value
        if q.get("watch") in ("true", "1"):
            return self._watch(h, node, q)
        with self.lock:
            items = [p for p in self.pods.values() if node is None or p["spec"]["nodeName"] == node]
            version = str(self.version)
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta = {"resourceVersion": version}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        self._send(h, 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    def _watch(self, h, node, q):
        events = queue.Queue()
        with self.lock:
            if int(q.get("resourceVersion") or 0) < self.version - 1000:
                events.put({"type": "ERROR", "object": status(410, "Expired", "too old resource version")})
            self.watches.append((events, node))
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        timeout = float(q.get("timeoutSeconds") or 1800)
        try:
            while True:
                try:
                    event = events.get(timeout=timeout)
                except queue.Empty:
                    break
                if event is None:
                    break
                line = json.dumps(event).encode() + b"\n"
                h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass
        finally:
            with self.lock:
                self.watches = [w for w in self.watches if w[0] is not events]
        h.close_connection = True


class PodCgroup:
    """A real cgroup whose path is a pod's under the cgroupfs driver
    (``.../kubepods/burstable/pod<uid>/<container id>``, system/cgroups.py), in the v1 cpu
    hierarchy: a process moved into it is, to the agent's reading of /proc, in that pod."""

    def __init__(self, uid, base="/sys/fs/cgroup/cpu"):
        if os.geteuid() != 0 or not os.access(base, os.W_OK) or \
                not os.path.exists(os.path.join(base, "cgroup.procs")):
            pytest.skip("needs root and a writable v1 cpu cgroup hierarchy")
        self.top = os.path.join(base, "stallscope-test-%d-%s" % (os.getpid(), uid[:8]))
        self.path = os.path.join(self.top, "kubepods", "burstable", "pod" + uid, uid.replace("-", "") * 2)
        os.makedirs(self.path)
        self.procs = os.path.join(self.path, "cgroup.procs")

    def remove(self):
        d = self.path
        while len(d) >= len(self.top):
            try:
                os.rmdir(d)
            except OSError:
                pass
            d = os.path.dirname(d)
