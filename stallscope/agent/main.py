"""The node agent: wires the hook socket, the rank table, the HTTP server and the
periodic jobs (rank expiry; exporters and the correlator add theirs) together.

Extension points, so that a new part adds one line of wiring rather than editing this
file's logic: ``registry.register(collector)``, ``add_route(path, fn)``,
``add_timeline_part(name, fn)``, ``table.handlers.append(fn)``, ``every(seconds, fn)``
and ``samples.record(scope, signal, value)`` for timelines of node signals.
"""
import dataclasses
import os
import signal
import socket as _socket
import sys
import threading
import time

from prometheus_client import CollectorRegistry

from .. import correlate, exporters
from ..hook import wire
from . import http, ingest, loader, metrics, samples, shards, state


@dataclasses.dataclass
class Config:
    listen: str = ":9478"
    socket: str = wire.DEFAULT_SOCKET
    node: str = ""
    max_ranks: int = 256
    rank_ttl: float = 120.0
    rank_exit_grace: float = 30.0
    timeline_seconds: float = 900.0
    procfs: str = "/proc"
    sysfs: str = "/sys"
    cgroupfs: str = "/sys/fs/cgroup"
    rootfs: str = "/"
    options: dict = dataclasses.field(default_factory=dict)  # per-part settings


class Agent:
    def __init__(self, config):
        self.config = config
        node = config.node or os.environ.get("NODE_NAME") or _socket.gethostname()
        self.table = state.RankTable(max_ranks=config.max_ranks, rank_ttl=config.rank_ttl,
                                     exit_grace=config.rank_exit_grace,
                                     timeline_seconds=config.timeline_seconds,
                                     procfs=config.procfs, node=node)
        self.samples = samples.SampleStore(config.timeline_seconds)
        self.registry = CollectorRegistry(auto_describe=False)
        self.routes = {"/api/v1/ranks": http.ranks_route, "/api/v1/timeline": http.timeline_route}
        self.timeline_parts = []
        self.jobs = []  # (period_s, fn)
        self.stopping = threading.Event()
        self.ingest = None
        self.server = None
        self.add_timeline_part("signals", self._signals_part)
        self.add_timeline_part("node_signals", self._node_signals_part)
        self.every(2.0, self._expire)
        self.exporters = exporters.install(self)
        self.loader = loader.install(self)   # batch load time, worker sizing
        self.shards = shards.install(self)   # shard reads, cache lookups
        self.correlator = correlate.install(self)

    def _expire(self):
        for key in self.table.expire():
            self.samples.drop_scope(key)

    def _signals_part(self, rank, seconds, scope=None):
        # Rank-scoped and node-wide signals share names (psi_*): each gets its own part.
        scope = rank.key if scope is None else scope
        return {sig: [[t, v] for t, v in self.samples.series(scope, sig, seconds)]
                for sig in self.samples.signals(scope)}

    def _node_signals_part(self, rank, seconds):
        return self._signals_part(rank, seconds, "node")

    def add_route(self, path, fn):
        self.routes[path] = fn

    def add_timeline_part(self, name, fn):
        self.timeline_parts.append((name, fn))

    def every(self, seconds, fn):
        self.jobs.append((seconds, fn))

    def start(self):
        """Bind both sockets (raising BindError / OSError with a clear message) and serve."""
        http.parse_listen(self.config.listen)  # a bad address fails before anything binds
        sock = ingest.bind(self.config.socket)
        try:
            self.server = http.make_server(self, self.config.listen)
        except OSError as e:
            sock.close()
            os.unlink(self.config.socket)
            raise ingest.BindError("cannot listen on %s: %s" % (self.config.listen, e.strerror))
        self.ingest = ingest.Ingest(sock, self.table)
        self.registry.register(metrics.RankCollector(self.table, self.ingest))
        self.ingest.start()
        threading.Thread(target=self.server.serve_forever, name="stallscope-http", daemon=True).start()
        threading.Thread(target=self._scheduler, name="stallscope-jobs", daemon=True).start()

    @property
    def port(self):
        return self.server.server_address[1]

    def _scheduler(self):
        next_run = {i: 0.0 for i in range(len(self.jobs))}
        while not self.stopping.is_set():
            now = time.monotonic()
            for i, (period, fn) in enumerate(list(self.jobs)):
                if now >= next_run.get(i, 0.0):
                    next_run[i] = now + period
                    try:
                        fn()
                    except Exception as e:  # one failing job must not stop the others
                        print("stallscope agent: periodic job %s failed: %s" % (
                            getattr(fn, "__name__", fn), e), file=sys.stderr)
            self.stopping.wait(0.2)

    def stop(self):
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
                os.unlink(self.config.socket)
            except OSError:
                pass


def run(config):
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
    print("stallscope agent: listening on %s, hook socket %s, node %s" % (
        config.listen, config.socket, agent.table.node), file=sys.stderr, flush=True)
    while not done.wait(1.0):
        pass
    agent.stop()
    print("stallscope agent: stopped", file=sys.stderr, flush=True)
    return 0
