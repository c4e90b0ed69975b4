"""Which pod a sender is, by name: the pods of this node from the Kubernetes API server.

The kernel names a sender's pod by its UID (its cgroup path: peer.py); the name a
report claims is the workload's word. Without a map from UID to name a process could
claim a pod name no live rank held and feed another team's job (issue 33). So the agent
keeps the pods of its node, UID -> (namespace, name), from the API server: a list of
``/api/v1/pods?fieldSelector=spec.nodeName=NODE``, then a watch from its
resourceVersion (bookmarks on; relisted on ``410 Gone``), as the Datadog and Fluent Bit
agents do.

Why the API server and not the kubelet's ``/pods``: reading the kubelet needs the
``nodes/proxy`` permission, which also opens the kubelet's exec and attach endpoints; a
list and watch of pods needs only ``get, list, watch`` on ``pods`` (the ClusterRole in
deploy/kubernetes/base/serviceaccount.yaml) and the field selector keeps the traffic to
this node's pods. The ServiceAccount token and CA are read the standard way
(/var/run/secrets/kubernetes.io/serviceaccount, the token again on every request, as
bound tokens rotate) and TLS is verified against that CA.

The rule (``resolve``), while the map is current:
- a sender in a pod the map has: a report's namespace and pod, where it names them,
  must be that pod's, else ``pod_mismatch``; where it names none, they are filled in;
- a sender in a pod the map does not have (not on this node): ``pod_unknown``;
- a sender outside any pod (a host process): it may not name a pod the map has
  (``pod_mismatch``); otherwise the domain rule holds (state.py).
While the map cannot be had (the API server unreachable, the token refused) the agent
says so (``stallscope_agent_pod_identity_up`` 0, /healthz's text, one log line when it
changes) and falls back to the domain rule alone: it never refuses every trainer.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import os
import ssl
import threading
import urllib.parse
from typing import Any, Callable

from ...host import log
from ...host.report import HookReport
from .refusal import Refused

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER = "in-cluster"
MAX_PODS = 4096              # kubelet's --max-pods is 110 by default; more is not a node
WATCH_TIMEOUT_S = 300        # the server ends each watch after this; the agent watches again
READ_TIMEOUT_S = 60.0        # silence beyond the watch's own timeout: a dead connection
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # backoff between failed attempts


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    server: str          # https://host:port
    token_file: str
    ca_file: str
    node: str

    @classmethod
    def of(cls, server: str, token_file: str, ca_file: str, node: str) -> KubeConfig:
        """``server`` is a URL or ``in-cluster`` (KUBERNETES_SERVICE_HOST and _PORT, as
        client-go's rest.InClusterConfig reads them); ValueError when unusable."""
        if server == IN_CLUSTER:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise ValueError("--kubernetes.api-server in-cluster: "
                                 "KUBERNETES_SERVICE_HOST/PORT are not set")
            server = "https://%s:%s" % ("[%s]" % host if ":" in host else host, port)
        url = urllib.parse.urlsplit(server)
        if url.scheme != "https" or not url.hostname:
            raise ValueError("--kubernetes.api-server must be https://HOST[:PORT] or in-cluster, "
                             "got %r" % server)
        if not node:
            raise ValueError("pod identity from Kubernetes needs the node's name (--node or NODE_NAME)")
        return cls(server, token_file, ca_file, node)


@dataclasses.dataclass(frozen=True)
class PodName:
    namespace: str
    name: str


def pod_of(obj: Any) -> tuple[str, PodName] | None:
    """(uid, name) of a Pod object as the API returns it, or None when malformed."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not (isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str)) or \
            not all(0 < len(v) <= 253 for v in (uid, ns, name)):
        return None
    return uid, PodName(ns, name)


class PodMap:
    """UID -> PodName for this node's pods; current or not. Thread-safe (the watcher
    writes, the ingest reads)."""

    def __init__(self) -> None:
        self.pods: dict[str, PodName] = {}
        self.names: dict[tuple[str, str], str] = {}   # (namespace, name) -> uid
        self.current = False
        self.problem: str | None = "not listed yet"
        self.lock = threading.Lock()

    def replace(self, pods: dict[str, PodName]) -> None:
        with self.lock:
            self.pods = dict(list(pods.items())[:MAX_PODS])
            self.names = {(p.namespace, p.name): uid for uid, p in self.pods.items()}
            self.current, self.problem = True, None

    def put(self, uid: str, pod: PodName) -> None:
        with self.lock:
            if uid not in self.pods and len(self.pods) >= MAX_PODS:
                return
            old = self.pods.get(uid)
            if old is not None:
                self.names.pop((old.namespace, old.name), None)
            self.pods[uid] = pod
            self.names[(pod.namespace, pod.name)] = uid

    def delete(self, uid: str) -> None:
        with self.lock:
            old = self.pods.pop(uid, None)
            if old is not None and self.names.get((old.namespace, old.name)) == uid:
                del self.names[(old.namespace, old.name)]

    def lost(self, problem: str) -> None:
        with self.lock:
            self.current, self.problem = False, problem

    def resolve(self, report: HookReport, pod_uid: str | None) -> HookReport:
        """Check the namespace and pod ``report`` claims against the sender's pod UID;
        raises Refused. Returns the report, its name completed from the pod map where it
        left it out; as it is while the map is not current."""
        with self.lock:
            if not self.current:
                return report
            ident = report.ident
            if pod_uid is None:  # a host process: not in the name of a pod of this node
                if ident.pod and (ident.namespace, ident.pod) in self.names:
                    raise Refused("pod_mismatch")
                return report
            real = self.pods.get(pod_uid)
        if real is None:
            raise Refused("pod_unknown")
        if (ident.namespace and ident.namespace != real.namespace) or \
                (ident.pod and ident.pod != real.name):
            raise Refused("pod_mismatch")
        if not ident.namespace or not ident.pod:
            named = dataclasses.replace(ident, namespace=real.namespace, pod=real.name)
            return dataclasses.replace(report, ident=named)
        return report


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Watcher:
    """Keeps a PodMap current from the API server, in its own thread."""

    def __init__(self, config: KubeConfig, pods: PodMap, stopping: threading.Event,
                 connect: Callable[[], http.client.HTTPSConnection] | None = None) -> None:
        self.config = config
        self.pods = pods
        self.stopping = stopping
        self.url = urllib.parse.urlsplit(config.server)
        self.connect = connect or self._connect
        self.selector = urllib.parse.quote("spec.nodeName=" + config.node, safe="=")
        self.conn: http.client.HTTPSConnection | None = None
        self.said: str | None = "start"  # the state last logged: one line per change
        self.thread = threading.Thread(target=self._run, name="stallscope-pods", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        conn = self.conn
        sock = conn.sock if conn is not None else None
        if sock is not None:  # wakes a watch blocked in its read
            try:
                sock.shutdown(2)
            except OSError:
                pass

    def _connect(self) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=self.config.ca_file)  # verified, hostname too
        return http.client.HTTPSConnection(self.url.hostname or "", self.url.port or 443,
                                           timeout=READ_TIMEOUT_S, context=context)

    def _get(self, query: str) -> http.client.HTTPResponse:
        with open(self.config.token_file) as f:
            token = f.read().strip()
        if self.conn is not None:
            self.conn.close()
        conn = self.conn = self.connect()
        conn.request("GET", "/api/v1/pods?" + query,
                     headers={"Authorization": "Bearer " + token, "Accept": "application/json",
                              "User-Agent": "stallscope-agent"})
        r = conn.getresponse()
        if r.status == 410:
            raise Gone()
        if r.status != 200:
            body = r.read(2048)
            try:
                reason = json.loads(body).get("message") or body[:200].decode("utf-8", "replace")
            except ValueError:
                reason = body[:200].decode("utf-8", "replace")
            raise OSError("the API server answered %d: %s" % (r.status, reason))
        return r

    def _list(self) -> str:
        """Every pod of this node (paged); returns the list's resourceVersion."""
        pods: dict[str, PodName] = {}
        cont = ""
        while True:
            query = "fieldSelector=%s&limit=500" % self.selector
            if cont:
                query += "&continue=" + urllib.parse.quote(cont)
            r = self._get(query)
            doc = json.loads(r.read())
            if not isinstance(doc, dict) or doc.get("kind") != "PodList":
                raise OSError("the API server's answer is not a PodList")
            for item in doc.get("items") or []:
                got = pod_of(item)
                if got is not None:
                    pods[got[0]] = got[1]
            meta = doc.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                self.pods.replace(pods)
                return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """Apply watch events until the server ends the watch; the newest resourceVersion."""
        r = self._get("fieldSelector=%s&watch=true&allowWatchBookmarks=true&timeoutSeconds=%d"
                      "&resourceVersion=%s" % (self.selector, WATCH_TIMEOUT_S, urllib.parse.quote(version)))
        while not self.stopping.is_set():
            line = r.readline(1 << 20)
            if not line:
                return version
            try:
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
            except (ValueError, KeyError, TypeError):
                raise OSError("a watch event that is not JSON") from None
            if kind == "ERROR":
                if isinstance(obj, dict) and obj.get("code") == 410:
                    raise Gone()
                raise OSError("watch error: %s" % (obj.get("message") if isinstance(obj, dict) else obj))
            rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
            version = str(rv) if rv else version
            got = pod_of(obj)
            if kind in ("ADDED", "MODIFIED") and got is not None:
                self.pods.put(*got)
            elif kind == "DELETED" and got is not None:
                self.pods.delete(got[0])
        return version

    def _say(self, state: str, text: str) -> None:
        if state != self.said:
            self.said = state
            log(text)

    def _run(self) -> None:
        failures = 0
        version = ""
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self._list()
                    self._say("up", "pod identity: %d pods of node %s from %s" % (
                        len(self.pods.pods), self.config.node, self.config.server))
                failures = 0
                version = self._watch(version)
            except Gone:
                version = ""
                continue
            except (OSError, ValueError, http.client.HTTPException, ssl.SSLError) as e:
                version = ""
                problem = "%s: %s" % (type(e).__name__, e)
                self.pods.lost(problem)
                self._say("down", "pod identity unavailable (%s): reports are checked by sender "
                          "domain only until the API server answers" % problem)
                self.stopping.wait(RETRY_S[min(failures, len(RETRY_S) - 1)])
                failures += 1
            finally:
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
