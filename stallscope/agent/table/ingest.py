"""The hook socket: a unix SOCK_SEQPACKET listener served by one selector thread.

Each hook process holds one connection; each message is one JSON report (see
stallscope/hook/wire.py). The sender comes from SO_PEERCRED (its PID and UID in the
agent's namespaces) and that PID's cgroup (peer.py), once per connection, so a
process cannot claim another's PID, rank or pod. Every message is validated; rejects
are counted by reason and never stop the loop or the connection: a zero-length message
is a counted reject (SEQPACKET delivers it as an empty read, which is also what a
closed peer reads like: poll's POLLRDHUP tells them apart).

Messages are read a tick at a time (TICK_S): after each pass over the ready connections
the thread lingers, so one wake-up serves every message that came meanwhile. Waking once
per message was half of the agent's ingest CPU at 8 ranks x 8 workers (issue 15: 2.3 %
of a core at 48 messages/s; 0.87 % with a 0.25 s tick; at 25 messages/s, 0.67 % with a
0.25 s tick, 0.53 % with 0.5 s, 0.47 % with 1 s: a message handled after a sleep finds its
data out of the CPU's caches, and the next ones of the pass find it in). A trainer's hook
flushes at most once a second and detection works in seconds, so the delay costs nothing that
matters. (With a 1 s tick, a clean-clone CI run of 2026-12-06 had
tests/agent/test_hangs.py's frozen FUSE read named storage_latency, not fuse_unhealthy,
and `stallscope run`'s live view show its first batches a redraw later; 0.5 s it is.)
Two things do not
wait, through a second epoll that watches only them: a new connection is accepted at
once (the sender's identity is read from /proc then: a process that connects, reports
and exits within the tick would be gone), and one that closes is served as soon as it
does (a dead worker must be read while it is still a zombie). A pass that hit the
per-connection read bound goes round again at once (capacity).

Connections are bounded four ways: MAX_CONNECTIONS in all, MAX_CONNECTIONS_PER_DOMAIN
for one sender domain (so one process's idle connections cannot lock every trainer out,
issue 33), MAX_CONNECTIONS_PER_PROCESS for one process within its domain (so one process
cannot take its own pod's share and lock its pod's trainers out, issue 50: the process
is the kernel's SO_PEERCRED PID, never what a message says), and a connection silent for
``idle_s`` is closed (counted in ``stallscope_agent_connections_closed_total``).
"""
from __future__ import annotations

import collections
import os
import select
import selectors
import socket
import struct
import threading
import time
from typing import Any, Callable, Optional

from ...cadence import LONGEST_SILENCE_S
from ...hook import wire
from ...host import log
from ...host.report import HookReport
from ..identity import peer
from ..identity.hooksocket import HookSocket
from ..identity.refusal import Refused
from . import validate
from .held import HELD

MAX_CONNECTIONS = 4096
# One sender domain (a pod; a cgroup and uid outside Kubernetes: peer.py) may hold at
# most this many: one process's idle connections filled the global cap and locked every
# trainer out (issue 33). A process holds one; 8 ranks of 16 workers in two loaders each
# are 264.
MAX_CONNECTIONS_PER_DOMAIN = 512
# ... and one process (its SO_PEERCRED PID) at most this many of its domain's, so that
# no process can take its own pod's share (issue 50): a hook holds one a process
# (hook/channel.py; a forked loader worker connects on its own). An eighth of the share:
# a sender that opens, sends and closes in quick turns (tools, tests) is not refused for
# closes the agent has not read yet, and 448 stay for the pod's other processes.
MAX_CONNECTIONS_PER_PROCESS = 64
# A connection that sends nothing for this long is closed: every hook stream reports at
# least every LONGEST_SILENCE_S (16 s; the report cadences, stallscope/cadence.py), and the
# hook reconnects before its next send when it finds its connection closed.
IDLE_S = max(60.0, 4 * LONGEST_SILENCE_S)
UNIDENTIFIED = ("unidentified",)  # the domain of peers the kernel could not name
TICK_S = 0.5
READ_BOUND = 64  # messages from one connection per pass, so one chatty peer cannot starve others
_UCRED = struct.Struct("3i")


Apply = Callable[[HookReport, Optional[peer.Source]], Any]
SourceOf = Callable[[int, int], Optional[peer.Source]]


class IngestStats:
    """What the ingest did, for the agent's self-health series."""

    def __init__(self) -> None:
        self.accepted = 0
        self.events = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self.socket_recreated = 0
        self.closed: collections.Counter[str] = collections.Counter()  # by the agent, by reason
        self.by_domain: collections.Counter[tuple[str, ...]] = collections.Counter()  # open
        # open, by (domain, PID as the kernel names the sender); PID 0 (a PID namespace
        # the agent cannot see) names no process: only its domain's bound applies
        self.by_process: collections.Counter[tuple[tuple[str, ...], int]] = collections.Counter()


class Peer:
    """One hook connection: its sender (None: the kernel could not name it), the domain
    its connections count against, and when it last sent."""

    __slots__ = ("source", "domain", "process", "last", "taken")

    def __init__(self, source: peer.Source | None, now: float, pid: int = 0) -> None:
        self.source = source
        self.taken = 0  # messages read from it: acknowledged to the hook (wire.py ACK)
        self.domain: tuple[str, ...] = source.domain if source is not None else UNIDENTIFIED
        # the sending process within its domain, from SO_PEERCRED (None: not known)
        self.process: tuple[tuple[str, ...], int] | None = (self.domain, pid) if pid > 0 else None
        self.last = now


class Ingest:
    """``apply(report, source)`` folds one validated report into the agent
    (the composition root's: the rank table, then the parts); it raises LookupError
    when the rank table is full."""

    def __init__(self, sock: Any, apply: Apply, source_of: SourceOf,
                 max_bytes: int = wire.MAX_MESSAGE_BYTES, stats: IngestStats | None = None,
                 hook_socket: HookSocket | None = None,
                 on_close: Callable[[peer.Source], None] | None = None,
                 tick_s: float = TICK_S, idle_s: float = IDLE_S,
                 max_per_domain: int = MAX_CONNECTIONS_PER_DOMAIN,
                 max_per_process: int = MAX_CONNECTIONS_PER_PROCESS) -> None:
        self.sock = sock
        self.tick_s = tick_s
        self.idle_s = idle_s
        self.max_per_domain = max_per_domain
        self.max_per_process = max_per_process
        # Told of each sender whose connection closed: a process that died leaves its
        # exit status readable (a zombie) until its parent reaps it, so this is the
        # moment to read why it died (the workers exporter's peer_gone).
        self.on_close = on_close
        self.hook_socket = hook_socket   # watched once a second, recreated when gone
        self.apply = apply
        self.source_of = source_of
        self.max_bytes = max_bytes
        self.buffer = bytearray(max_bytes + 1)  # one byte over: a longer message reads as truncated
        self.view = memoryview(self.buffer)
        self.stats = stats or IngestStats()
        self._logged: set[tuple[str, str, int]] = set()
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.wake_r, self.wake_w = os.pipe()
        # While lingering: only hang-ups, new connections and the stop pipe wake the thread.
        self.hangups = select.epoll()
        self.thread = threading.Thread(target=self._loop, name="stallscope-ingest", daemon=True)

    def start(self) -> None:
        self.selector.register(self.sock, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.hangups.register(self.wake_r, select.EPOLLIN)
        self.hangups.register(self.sock.fileno(), select.EPOLLIN)
        self.thread.start()

    def stop(self) -> None:
        if self.stopping.is_set():
            return  # stopped already
        self.stopping.set()
        os.write(self.wake_w, b"x")
        self.thread.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, Peer) and isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
        self.selector.close()
        self.hangups.close()

    def _loop(self) -> None:
        next_check = time.monotonic() + 1.0
        while not self.stopping.is_set():
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                if self.hook_socket is not None:
                    self._check_socket(self.hook_socket)
                self._close_idle(time.monotonic())
            saturated = False
            for key, _ in self.selector.select(timeout=1.0):
                saturated |= self._serve(key)
            if not saturated:
                self._linger(self.tick_s)

    def _serve(self, key: selectors.SelectorKey) -> bool:
        """Accept on the listening socket or read a connection; True when the read
        bound stopped the read (more may wait)."""
        if key.data is None:
            self._accept()
        elif key.data != "wake" and isinstance(key.fileobj, socket.socket):
            return self._read(key.fileobj, key.data)
        return False

    def _linger(self, seconds: float) -> None:
        """Let messages gather for ``seconds``, serving only connections that close."""
        until = time.monotonic() + seconds
        while not self.stopping.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            for fd, _events in self.hangups.poll(left):
                key = self.selector.get_map().get(fd)
                if key is not None:
                    self._serve(key)

    def _check_socket(self, hook_socket: HookSocket) -> None:
        fresh = hook_socket.check()
        if fresh is not None:
            self.selector.unregister(self.sock)
            self.hangups.unregister(self.sock.fileno())
            self.sock.close()
            self.sock = fresh
            self.selector.register(fresh, selectors.EVENT_READ, None)
            self.hangups.register(fresh.fileno(), select.EPOLLIN)
            self.stats.socket_recreated += 1

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stats.rejected["accept_error"] += 1
                return
            if self.stats.connections >= MAX_CONNECTIONS:
                self.stats.rejected["too_many_connections"] += 1
                conn.close()
                continue
            source: Any = None
            pid = 0
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                pid, uid, _gid = _UCRED.unpack(creds)
                # PID 0: the peer is in a PID namespace the agent cannot see (no hostPID).
                source = self.source_of(pid, uid) if pid > 0 else None
            except OSError:
                pid = 0
            peer = Peer(source, time.monotonic(), pid)
            if self.stats.by_domain[peer.domain] >= self.max_per_domain:
                self.stats.rejected["too_many_connections_per_sender"] += 1
                conn.close()
                continue
            if peer.process is not None and self.stats.by_process[peer.process] >= self.max_per_process:
                self.stats.rejected["too_many_connections_per_process"] += 1
                conn.close()
                continue
            conn.setblocking(False)
            self.stats.connections += 1
            self.stats.by_domain[peer.domain] += 1
            if peer.process is not None:
                self.stats.by_process[peer.process] += 1
            self.selector.register(conn, selectors.EVENT_READ, peer)
            self.hangups.register(conn.fileno(), select.EPOLLRDHUP)

    def _drop(self, conn: socket.socket, peer: Peer) -> None:
        self.selector.unregister(conn)
        self.hangups.unregister(conn.fileno())
        conn.close()
        self.stats.connections -= 1
        self.stats.by_domain[peer.domain] -= 1
        if self.stats.by_domain[peer.domain] <= 0:
            del self.stats.by_domain[peer.domain]
        if peer.process is not None:
            self.stats.by_process[peer.process] -= 1
            if self.stats.by_process[peer.process] <= 0:
                del self.stats.by_process[peer.process]

    def _close_idle(self, now: float) -> None:
        """Close the connections silent for idle_s (their process is alive: no peer_gone).
        One with a message waiting is not silent: it was last read a tick ago, and a
        tick may be as long as a short idle timeout."""
        for key in list(self.selector.get_map().values()):
            peer = key.data
            if isinstance(peer, Peer) and isinstance(key.fileobj, socket.socket) \
                    and now - peer.last > self.idle_s and not self._waiting(key.fileobj):
                self._drop(key.fileobj, peer)
                self.stats.closed["idle"] += 1

    @staticmethod
    def _waiting(conn: socket.socket) -> bool:
        p = select.poll()
        p.register(conn, select.POLLIN)
        return any(ev & select.POLLIN for _, ev in p.poll(0))

    @staticmethod
    def _hung_up(conn: socket.socket) -> bool:
        p = select.poll()
        p.register(conn, select.POLLRDHUP | select.POLLHUP)
        return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))

    def _read(self, conn: socket.socket, peer: Peer) -> bool:
        """Read what ``conn`` holds, up to READ_BOUND messages; True when the bound
        stopped it (more may wait)."""
        taken = peer.taken
        try:
            return self._read_some(conn, peer)
        finally:
            if peer.taken != taken and conn.fileno() >= 0:
                try:  # never waits: a hook that does not read its acks loses them
                    conn.send(wire.ACK.pack(peer.taken), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
                except OSError:
                    pass

    def _read_some(self, conn: socket.socket, peer: Peer) -> bool:
        for _ in range(READ_BOUND):
            try:
                # into one buffer kept for the thread: recvmsg(n) allocates n bytes a call,
                # past malloc.py's fixed mmap threshold an mmap and munmap each time
                size, _anc, flags, _addr = conn.recvmsg_into([self.buffer])
                data = bytes(self.view[:min(size, self.max_bytes + 1)])
            except (BlockingIOError, InterruptedError):
                return False
            except ConnectionResetError:
                # The peer closed with acks of ours unread: the kernel sets ECONNRESET on
                # this end (net/unix/af_unix.c, unix_release_sock) and reports it once,
                # before the messages still queued here (sock_error() is checked ahead of
                # the queue). Those were sent and are read: dropping the connection now
                # lost the last ~12 messages of every sender that closed.
                continue
            except OSError:
                data, flags = None, 0
            if data is None or (not data and self._hung_up(conn)):  # peer closed
                self._drop(conn, peer)
                if self.on_close is not None and peer.source is not None:
                    try:
                        self.on_close(peer.source)
                    except Exception as e:  # must not stop ingestion
                        self._log_internal(e)
                return False
            peer.last = time.monotonic()
            peer.taken += 1
            if flags & socket.MSG_TRUNC or len(data) > self.max_bytes:
                self.stats.rejected["oversize"] += 1
                continue
            self.handle(data, peer.source, checked=True)
        return True

    def _log_internal(self, e: Exception) -> None:
        """Say each kind of internal error once, with where it came from: counted alone
        it cannot be fixed (a fuzz run found some; the message is never logged, it may be
        hostile)."""
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        key = (type(e).__name__, where.filename, where.lineno or 0)
        if key in self._logged or len(self._logged) >= 20:
            return
        self._logged.add(key)
        log("ingest: internal error %s at %s:%d (%s): the message was counted as a reject" % (
            type(e).__name__, where.filename, where.lineno or 0, where.name))

    def handle(self, data: bytes, source: peer.Source | None = None, checked: bool = False) -> bool:
        """Validate and apply one message; never raises. ``checked``: from a connection,
        whose sender the kernel named (or could not name: then it is refused)."""
        try:
            if checked and source is None:
                raise validate.Reject("no_credentials")
            report = validate.parse(data, self.max_bytes)
            if self.apply(report, source) is HELD:
                return True  # counted when its trainer's report applies it, or refused
        except validate.Reject as r:
            self.stats.rejected[r.reason] += 1
            return False
        except Refused as m:
            self.stats.rejected[m.reason] += 1
            return False
        except LookupError:
            self.stats.rejected["rank_limit"] += 1
            return False
        except Exception as e:  # a bug in a handler must not stop ingestion
            self.stats.rejected["internal_error"] += 1
            self._log_internal(e)
            return False
        self.stats.accepted += 1
        self.stats.events += len(report.events)
        return True
