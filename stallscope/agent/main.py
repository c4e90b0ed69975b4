"""The node agent's composition root: the only module that knows every part.

It builds the rank table and the sample store behind a ``Host``, the parts (the
hook-fed ``ranks``, ``loader`` and ``shards``, the node exporters and their runner, the
``correlator``), wires their explicit cross-part calls (the loader sizing asks the cfs
exporter for a rank's quota; the correlator asks the gpu exporter where a rank's GPU
samples come from), and runs the hook socket, the HTTP server and the scheduler.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket as _socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from prometheus_client import CollectorRegistry

from .. import exporters
from ..host import Part, log
from ..host.options import flag
from ..hook import wire
from . import http, ingest
from .api import CoreRoutes
from .correlator import CorrelatorOptions, CorrelatorPart
from .host import AgentHost, Parts
from .loader import LoaderPart, no_quota
from .ranks import RanksPart
from .samples import SampleStore
from .shards import ShardPart
from .state import RankTable


@dataclasses.dataclass(frozen=True)
class AgentOptions:
    listen: str = flag(":9478", "--listen", "Address for /metrics, /healthz and /api/v1/*.",
                       metavar="HOST:PORT")
    socket: str = flag(wire.DEFAULT_SOCKET, "--socket",
                       "Unix socket the training processes report to (env STALLSCOPE_SOCKET).",
                       metavar="PATH", envvar="STALLSCOPE_SOCKET")
    node: str = flag("", "--node", "Node name for ranks that do not report one (env NODE_NAME; "
                     "default hostname).", envvar="NODE_NAME")
    max_ranks: int = flag(256, "--max-ranks", "Most ranks tracked at once; reports from more are "
                          "rejected and counted.", lo=1, hi=65536)
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
    enabled: Dict[str, Optional[bool]] = dataclasses.field(default_factory=dict)
    correlator: CorrelatorOptions = CorrelatorOptions()
    parts: Dict[type, Any] = dataclasses.field(default_factory=dict)


class Agent:
    def __init__(self, config: Config) -> None:
        self.config = config
        o = config.agent
        node = o.node or os.environ.get("NODE_NAME") or _socket.gethostname()
        self.table = RankTable(max_ranks=o.max_ranks, rank_ttl=o.rank_ttl,
                               exit_grace=o.rank_exit_grace, timeline_seconds=o.timeline_seconds,
                               procfs_root=o.procfs, node=node)
        self.samples = SampleStore(o.timeline_seconds)
        self.stopping = threading.Event()
        self.host = AgentHost(self.table, self.samples, procfs=o.procfs, sysfs=o.sysfs,
                              cgroupfs=o.cgroupfs, rootfs=o.rootfs, stopping=self.stopping)
        self.stats = ingest.IngestStats()
        self.node_exporters, self.runner = exporters.build(
            self.host, config.enabled, config.parts, config.exporters)
        by_name: Dict[str, Any] = {e.name: e for e in self.node_exporters}
        cfs, gpu = by_name.get("cfs"), by_name.get("gpu")  # their explicit calls, when they run
        self.loader = LoaderPart(self.host, quota_of=cfs.quota_of if cfs else no_quota)
        self.correlator = CorrelatorPart(self.host, config.correlator,
                                         gpu_source_of=gpu.source_of if gpu else (lambda _k: None))
        part_list: List[Part] = [RanksPart(self.host, self.table, self.stats), self.loader,
                                 ShardPart(self.host), *self.node_exporters, self.runner,
                                 self.correlator]
        self.parts = Parts(self.host, part_list)
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in self.parts.collectors():
            self.registry.register(collector)
        self.registry.register(self.parts)
        self.routes = CoreRoutes(self.host, self.parts).routes()
        self.routes.update(self.parts.routes())
        self.jobs = [(2.0, self._expire)] + self.parts.jobs()
        self.ingest: Optional[ingest.Ingest] = None
        self.server: Any = None

    def apply(self, msg: Any, peer_pid: Optional[int], peer_uid: Optional[int]) -> Any:
        """One validated hook message: the rank table, then every part."""
        rank = self.table.apply(msg, peer_pid=peer_pid, peer_uid=peer_uid)
        self.parts.handle(msg, rank)
        return rank

    def _expire(self) -> None:
        self.parts.forget(self.table.expire())

    def healthy(self) -> Any:
        return True, "ok"

    def start(self) -> None:
        """Bind both sockets (raising BindError / OSError with a clear message) and serve."""
        o = self.config.agent
        http.parse_listen(o.listen)  # a bad address fails before anything binds
        sock = ingest.bind(o.socket)
        try:
            self.server = http.make_server(o.listen, self.registry, self.routes, self.healthy)
        except OSError as e:
            sock.close()
            os.unlink(o.socket)
            raise ingest.BindError("cannot listen on %s: %s" % (o.listen, e.strerror)) from None
        self.ingest = ingest.Ingest(sock, self.apply, stats=self.stats)
        self.ingest.start()
        threading.Thread(target=self.server.serve_forever, name="stallscope-http", daemon=True).start()
        threading.Thread(target=self._scheduler, name="stallscope-jobs", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def _scheduler(self) -> None:
        next_run = {i: 0.0 for i in range(len(self.jobs))}
        while not self.stopping.is_set():
            now = time.monotonic()
            for i, (period, fn) in enumerate(self.jobs):
                if now >= next_run[i]:
                    next_run[i] = now + period
                    try:
                        fn()
                    except Exception as e:  # one failing job must not stop the others
                        log("periodic job %s failed: %s" % (getattr(fn, "__qualname__", fn), e))
            self.stopping.wait(0.2)

    def stop(self) -> None:
        """Idempotent: a second call (e.g. a test's cleanup after a signal) is a no-op."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.ingest is not None:
            self.ingest.stop()
            self.ingest.sock.close()
            try:
                os.unlink(self.config.agent.socket)
            except OSError:
                pass


def run(config: Config) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit code."""
    agent = Agent(config)
    try:
        agent.start()
    except ingest.BindError as e:
        print("stallscope agent: %s" % e, file=sys.stderr)
        return 1
    except ValueError as e:
        print("stallscope agent: %s" % e, file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    o = config.agent
    log("listening on %s, hook socket %s, node %s" % (o.listen, o.socket, agent.table.node))
    while not done.wait(1.0):
        pass
    agent.stop()
    log("stopped")
    return 0
