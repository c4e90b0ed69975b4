"""The node agent's composition root: the only module that knows every part.

It builds the rank table and the sample store behind a ``Host``, the parts (the
hook-fed ``ranks``, ``loader`` and ``shards``, the node exporters and their runner, the
``correlator``), wires their explicit cross-part calls (the loader sizing asks the cfs
exporter for a rank's quota; the correlator asks the gpu exporter where a rank's GPU
samples come from), and runs the hook socket, the HTTP server and the scheduler.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import gc
import os
import resource
import signal
import socket as _socket
import sys
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry

from .. import exporters
from ..hook import wire
from ..host import Part, log
from ..host.options import flag
from ..host.report import HookReport
from . import malloc
from .api import CoreRoutes
from .host import AgentHost, Parts
from .identity import allowlist, kubepods, names, peer
from .identity.hooksocket import BindError, HookSocket, SocketSpec, parse_group, parse_mode
from .identity.refusal import Refused
from .parts.correlator import CorrelatorOptions, CorrelatorPart
from .parts.hangs import HangOptions, HangsPart
from .parts.loader import LoaderPart
from .parts.ranks import RanksPart
from .parts.shards import ShardPart
from .table import ingest
from .table.budget import Budget
from .table.held import HELD, Held
from .table.samples import SampleStore
from .table.state import RankTable
from .web import healthd, http, httppool

# Jobs due within this of each other run in one wake-up of the scheduler.
JOB_SLACK_S = 0.05
# A step of stop() that takes this long is logged (a Kubernetes pod has 30 s between
# SIGTERM and SIGKILL; a CI run once saw the agent not gone 10 s after SIGTERM)
SLOW_STOP_S = 1.0


@dataclasses.dataclass(frozen=True)
class AgentOptions:
    listen: str = flag(":9478", "--listen", "Address for /metrics, /healthz and /api/v1/*.",
                       metavar="HOST:PORT")
    socket: str = flag(wire.DEFAULT_SOCKET, "--socket",
                       "Unix socket the training processes report to (env STALLSCOPE_SOCKET). Its "
                       "directory must not be writable by other users.",
                       metavar="PATH", envvar="STALLSCOPE_SOCKET")
    socket_mode: str = flag("0660", "--socket-mode",
                            "Permissions of the socket file (octal): who may connect (the agent's "
                            "user and --socket-group). Every connection is identified by the "
                            "kernel either way.", metavar="MODE")
    socket_group: str = flag("", "--socket-group",
                             "Group of the socket file (name or GID): the trainers' (their pods' "
                             "supplementalGroups); empty: the agent's own group.", metavar="GROUP")
    hook_idle_timeout: float = flag(60.0, "--hook-idle-timeout", "Close a hook connection that "
                                    "sends nothing for this long (a hook reports at least every "
                                    "5 s and reconnects).", lo=1, hi=86400, metavar="SECONDS")
    kubernetes_api_server: str = flag("", "--kubernetes.api-server",
                                      "Check the pod names reports claim against this node's pods "
                                      "from the API server: in-cluster (KUBERNETES_SERVICE_HOST) or "
                                      "https://HOST:PORT; empty: off (docs/deploy.md).", metavar="URL")
    kubernetes_token_file: str = flag(kubepods.SERVICE_ACCOUNT + "/token", "--kubernetes.token-file",
                                      "Bearer token for the API server (read on every request).",
                                      metavar="PATH")
    kubernetes_ca_file: str = flag(kubepods.SERVICE_ACCOUNT + "/ca.crt", "--kubernetes.ca-file",
                                   "CA bundle the API server's certificate is verified against.",
                                   metavar="PATH")
    identity_allow: str = flag("", "--identity.allow",
                               "File pinning pod names to the uids and cgroups that may report as "
                               "them (NAMESPACE/POD uid=N cgroup=PATH-or-glob, one a line; "
                               "docs/deploy.md). Read at start (a bad file: exit 2) and on SIGHUP "
                               "or when it changes (a bad one is counted, the old one kept). "
                               "Without it, a name no pod map vouches for stays bound to its first "
                               "claimant's uid and cgroup until that cgroup is gone.", metavar="FILE")
    node: str = flag("", "--node", "Node name for ranks that do not report one (env NODE_NAME; "
                     "default hostname).", envvar="NODE_NAME")
    max_ranks: int = flag(64, "--max-ranks", "Most ranks tracked at once; reports from more are "
                          "rejected and counted. With --timeline-seconds it sets the memory "
                          "ceiling the agent prints at start.", lo=1, hi=65536)
    rank_ttl: float = flag(120.0, "--rank-ttl", "Forget a rank silent for this long (its process "
                           "gone sooner).", lo=1, hi=86400, metavar="SECONDS")
    rank_exit_grace: float = flag(30.0, "--rank-exit-grace", "Keep an exited rank's series this "
                                  "long, so the final batches get scraped.", lo=0, hi=3600,
                                  metavar="SECONDS")
    timeline_seconds: float = flag(900.0, "--timeline-seconds", "How much per-rank history to "
                                   "keep for the correlator and the API.", lo=10, hi=86400,
                                   metavar="SECONDS")
    procfs: str = flag("/proc", "--path.procfs", "procfs mount point (/host/proc in a DaemonSet).",
                       metavar="PATH")
    sysfs: str = flag("/sys", "--path.sysfs", "sysfs mount point.", metavar="PATH")
    cgroupfs: str = flag("/sys/fs/cgroup", "--path.cgroupfs", "cgroup filesystem root.",
                         metavar="PATH")
    rootfs: str = flag("/", "--path.rootfs", "The host's root filesystem (/host/root in a "
                       "DaemonSet).", metavar="PATH")


@dataclasses.dataclass
class Config:
    """Everything ``stallscope agent`` is told: its own options, the exporters' schedule
    and which exporters run ({name: True/False/None=default}), and each part's typed
    options by class (a part missing here runs with its defaults)."""
    agent: AgentOptions = AgentOptions()
    exporters: exporters.ExportersOptions = exporters.ExportersOptions()
    enabled: dict[str, bool | None] = dataclasses.field(default_factory=dict)
    correlator: CorrelatorOptions = CorrelatorOptions()
    hangs: HangOptions = HangOptions()
    parts: dict[type, Any] = dataclasses.field(default_factory=dict)


class Agent:
    def __init__(self, config: Config) -> None:
        self.config = config
        o = config.agent
        node = o.node or os.environ.get("NODE_NAME") or _socket.gethostname()
        self.table = RankTable(max_ranks=o.max_ranks, rank_ttl=o.rank_ttl,
                               exit_grace=o.rank_exit_grace, timeline_seconds=o.timeline_seconds,
                               procfs_root=o.procfs, node=node)
        self.budget = Budget(o.max_ranks, o.timeline_seconds)
        self.samples = SampleStore(o.timeline_seconds, self.budget)
        self.stopping = threading.Event()
        self.host = AgentHost(self.table, self.samples, procfs=o.procfs, sysfs=o.sysfs,
                              cgroupfs=o.cgroupfs, rootfs=o.rootfs, stopping=self.stopping)
        self.stats = ingest.IngestStats()
        self.held = Held()
        self.pods = kubepods.PodMap()
        self.allow = allowlist.AllowList(o.identity_allow)
        self.table.names = names.Names(o.cgroupfs, self.pods, self.allow)
        self.watcher: kubepods.Watcher | None = None
        self.node_exporters, self.runner = exporters.build(
            self.host, config.enabled, config.parts, config.exporters)
        by_name: dict[str, Any] = {e.name: e for e in self.node_exporters}
        workers = by_name.get("workers")
        self.peer_gone = workers.peer_gone if workers else None  # why a worker died
        # what one part learns for the others (a rank's GPU, its CPU quota) is a fact on
        # the host (host/facts.py), not a call wired here
        self.loader = LoaderPart(self.host)
        self.hangs = HangsPart(self.host, config.hangs)
        self.correlator = CorrelatorPart(self.host, config.correlator, hang_of=self.hangs.latest)
        part_list: list[Part] = [RanksPart(self.host, self.table, self.stats, self.held, self.pods),
                                 self.loader, ShardPart(self.host), *self.node_exporters, self.runner,
                                 self.correlator, self.hangs]
        self.parts = Parts(self.host, part_list)
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in self.parts.collectors():
            self.registry.register(collector)
        self.registry.register(self.parts)
        self.routes = CoreRoutes(self.host, self.parts, self.budget).routes()
        self.routes.update(self.parts.routes())
        self.jobs = [(healthd.HEALTH_BEAT_S, self.beat), (2.0, self._expire), (malloc.TRIM_S, malloc.trim),
                     (1.0, self.table.names.poll)] + self.parts.jobs()
        self.ingest: ingest.Ingest | None = None
        self.hook_socket: HookSocket | None = None
        self.server: Any = None
        self.http_stats = httppool.Stats()  # exported by Parts.collect, before the server runs too
        self.parts.http = self.http_stats
        self._serving: threading.Thread | None = None

    def apply(self, report: HookReport, source: peer.Source | None = None) -> Any:
        """One validated hook message: the rank table, then every part. ``source``: the
        sender as the kernel names it (None: an in-process caller). A worker's report
        that comes before its trainer's first is held until it does (held.py)."""
        try:
            if source is not None and self.watcher is not None:
                # the claimed pod is the sender's (kubepods.py), completed from the pod map
                report = self.pods.resolve(report, source.pod_uid)
            rank = self.table.apply(report, source)
        except Refused as m:
            if m.reason == "unknown_rank" and not report.main:
                if self.held.hold(report.key, report, source):
                    return HELD
                raise Refused("held_limit") from None  # its sender's share is full (held.py)
            raise
        self.parts.handle(report, rank)
        if report.main and len(self.held):
            for held_report, held_source in self.held.take(rank.key):
                try:
                    self.parts.handle(held_report, self.table.apply(held_report, held_source))
                    self.stats.accepted += 1
                    self.stats.events += len(held_report.events)
                except (Refused, LookupError) as e:
                    self.stats.rejected[getattr(e, "reason", "rank_limit")] += 1
        return rank

    def _expire_held(self) -> None:
        self.stats.rejected["unknown_rank"] += 1

    def source_of(self, pid: int, uid: int) -> peer.Source | None:
        return peer.of_peer(self.config.agent.procfs, pid, uid)

    def _expire(self) -> None:
        self.parts.forget(self.table.expire())
        self.held.expire(self._expire_held)
        self.samples.expire()

    def beat(self) -> None:
        """The status the health responder answers /healthz with (httpserver.py front),
        written by the jobs thread, and a turn of the HTTP loop: both stamped, so that a
        wedged agent is answered 503 (healthd.py STALE_S)."""
        page = getattr(self.server, "health", None)
        if page is None:
            return
        ok, text = self.healthy()
        page.write(ok, text)
        self.server.beat()

    def healthy(self) -> tuple[bool, str]:
        problem = self.hook_socket.problem if self.hook_socket is not None else None
        if problem:
            return False, problem
        if self.watcher is not None and not self.pods.current:  # degraded, not failing
            return True, "ok (pod identity unavailable: %s; names are checked by sender domain only)" % (
                self.pods.problem)
        return True, "ok"

    def start(self) -> None:
        """Bind both sockets (raising BindError / ValueError with a clear message) and serve."""
        o = self.config.agent
        http.parse_listen(o.listen)  # a bad address fails before anything binds
        self.allow.load()             # so does a bad allow-list (allowlist.py)
        spec = SocketSpec(o.socket, parse_mode(o.socket_mode), parse_group(o.socket_group))
        if o.kubernetes_api_server:
            kube = kubepods.KubeConfig.of(o.kubernetes_api_server, o.kubernetes_token_file,
                                          o.kubernetes_ca_file, self.table.node)
            self.watcher = kubepods.Watcher(kube, self.pods, self.stopping)
        self.hook_socket = HookSocket(spec)
        sock = self.hook_socket.bind()
        try:
            self.server = http.make_server(o.listen, self.parts.render, self.routes, self.healthy,
                                           stats=self.http_stats, front=True)
        except OSError as e:
            sock.close()
            self.hook_socket.remove()
            raise BindError("cannot listen on %s: %s" % (o.listen, e.strerror)) from None
        self.beat()  # the responder's first answer is the agent's status, not "starting"
        self.ingest = ingest.Ingest(sock, self.apply, self.source_of, stats=self.stats,
                                    hook_socket=self.hook_socket, on_close=self.peer_gone,
                                    idle_s=o.hook_idle_timeout)
        self.ingest.start()
        if self.watcher is not None:
            self.watcher.start()
        self._serving = threading.Thread(target=self.server.serve_forever, name="stallscope-http",
                                         daemon=True)
        self._serving.start()
        threading.Thread(target=self._scheduler, name="stallscope-jobs", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def _scheduler(self) -> None:
        """Runs each job every its period, on a grid from the start, so the jobs due
        together run in one wake-up, and sleeps until the next is due (it woke every 0.2 s
        with nothing to do; a wake-up costs ~0.06-0.2 ms of CPU on a VM, FIELD-NOTES)."""
        next_run = [0.0] * len(self.jobs)
        while not self.stopping.is_set():
            now = time.monotonic()
            for i, (period, fn) in enumerate(self.jobs):
                if now >= next_run[i] - JOB_SLACK_S:
                    due = next_run[i] + period
                    next_run[i] = due if due > now else now + period  # fell behind: no burst
                    try:
                        fn()
                    except Exception as e:  # one failing job must not stop the others
                        log("periodic job %s failed: %s" % (getattr(fn, "__qualname__", fn), e))
            # a sleep, not stopping.wait(): ~half the CPU a wake-up on a VM (loaderstate.py);
            # a stop is seen when the next job is due
            time.sleep(max(0.0, min(min(next_run, default=now + 1.0) - time.monotonic(), 1.0)))

    def stop(self) -> None:
        """Idempotent: a second call (e.g. a test's cleanup after a signal) is a no-op."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        steps = []  # (step, seconds): one that takes long is said, with what it waited on
        t = time.monotonic()

        def done(step: str) -> None:
            nonlocal t
            now = time.monotonic()
            steps.append((step, now - t))
            t = now

        if self.watcher is not None:
            self.watcher.stop()
            done("pod watch")
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            done("http server")
        if self.ingest is not None:
            self.ingest.stop()
            self.ingest.sock.close()
            done("ingest")
        if self.hook_socket is not None:
            self.hook_socket.remove()
        if self._serving is not None:  # shutdown() has stopped it: this is its last instant
            self._serving.join(timeout=5.0)
            done("http loop")
        slow = ["%s %.1f s" % (step, secs) for step, secs in steps if secs >= SLOW_STOP_S]
        if slow:
            log("stopping took long: %s" % ", ".join(slow))


def raise_open_files() -> None:
    """The soft limit on open files up to the hard one, as Go's runtime does for every
    exporter written in it: the agent keeps descriptors open on the /proc files of each
    loader task it reads (the sampler's two, the exporters' three: system/procfs.py
    KeptFiles), ~2,600 at 64 ranks x 8 workers against the usual soft 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:  # a limit the kernel refuses: keep the soft one
            log("open files: kept the soft limit %d (%s)" % (soft, e))


def run(config: Config) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit code."""
    malloc.tune()  # before any of the agent's threads allocates (malloc.py)
    raise_open_files()
    agent = Agent(config)
    done = threading.Event()
    # Before anything answers: a SIGTERM right after /healthz first says ok must stop
    # the agent cleanly, not kill it.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    signal.signal(signal.SIGHUP, lambda *_: agent.allow.request())  # reload --identity.allow
    # `kill -USR1 <agent>` writes every thread's Python stack to stderr (the log): what a
    # stop or a stuck collection waits on, without a debugger in the container
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        agent.start()
    except BindError as e:
        print("stallscope agent: %s" % e, file=sys.stderr)
        return 1
    except ValueError as e:
        print("stallscope agent: %s" % e, file=sys.stderr)
        return 2
    # What start-up made (modules, parts, tables) lives as long as the agent: out of the
    # collector's reach, its full collections no longer walk it every time.
    gc.freeze()
    o = config.agent
    log("listening on %s, hook socket %s, node %s" % (o.listen, o.socket, agent.table.node))
    log(agent.budget.describe())
    while not done.wait(60.0):  # a signal interrupts the wait (its handler sets done)
        pass
    agent.stop()
    log("stopped")
    return 0
