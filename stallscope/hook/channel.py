"""Delivery of hook events to the node agent: batched, non-blocking, bounded.

The training loop only appends two integers to a list per batch (see loop.py), and two
per poll of a DataLoader's queue where the wait is split (transfer.py). A daemon thread
in each process drains those lists once a second and sends one message per
stream that has news (see TRAINER_FLUSH_S and WORKER_FLUSH_S below) over a unix
SOCK_SEQPACKET connection to the agent, non-blocking.

Why SEQPACKET: it keeps message boundaries like a datagram, but each connection has its
own send buffer. Unix datagram sockets share one receive queue of
net.unix.max_dgram_qlen messages (10 by default) across all senders, which 8 ranks and
their loader workers flushing on the same beat would overflow. It also gives the agent
the sender's PID in its own PID namespace via SO_PEERCRED.

When the agent is absent, killed or restarted, the send fails at once (ENOENT,
ECONNREFUSED, EPIPE): the pending events are counted as dropped and the channel
reconnects on a later flush. What was sent but never taken (it sat in the socket queue
of an agent that was killed) is counted as dropped too: the agent acknowledges what it
takes (wire.py ACK), read once a flush, never per batch. When the agent is merely slow
(EAGAIN), events stay pending up to a bound. Nothing here can raise into, or block, the training loop.
"""
from __future__ import annotations

import atexit
import collections
import os
import socket
import threading
import time

from .. import cadence
from . import phases, wire
from .stream import Stream, moved, share_moved

__all__ = ["Channel", "Stream", "get"]

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .identity import Ident
    from .wire import Message

    # (ident, role, payload) of one message that is not a stream's batches
    Extra = tuple[Ident, str, Message]

# The report cadences are the hook's contract with the agent, declared once in
# stallscope/cadence.py (TRAINER_FLUSH_S, WORKER_FLUSH_S, HEARTBEAT_S, ...): the
# flush thread looks every FLUSH_INTERVAL_S; a trainer's batches go then when they are
# news (its first reports, a wait share that moved: stream.py share_moved; a next()
# blocked past BLOCKED_REPORT_S) and every TRAINER_FLUSH_S while its wait holds steady;
# a worker's per worker_gap(), at once when its load time moved (stream.py moved).
FLUSH_INTERVAL_S = float(os.environ.get("STALLSCOPE_FLUSH_INTERVAL", "") or cadence.FLUSH_INTERVAL_S)
TRAINER_FLUSH_S = cadence.TRAINER_FLUSH_S
TRAINER_PROMPT_REPORTS = cadence.TRAINER_PROMPT_REPORTS
HEARTBEAT_S = cadence.HEARTBEAT_S
WORKER_FLUSH_S = cadence.WORKER_FLUSH_S
worker_gap = cadence.worker_gap
BLOCKED_REPORT_S = cadence.BLOCKED_REPORT_S
BLOCKED_REPORT_NS = int(BLOCKED_REPORT_S * 1e9)
RECONNECT_S = 1.0
class Channel:
    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get("STALLSCOPE_SOCKET") or wire.DEFAULT_SOCKET
        self.pid = os.getpid()
        self.streams: list[Stream] = []
        self.extra: list[Extra] = []  # messages queued by other hook parts
        # callables drained on each flush, returning such messages
        self.sources: list[Callable[[], Iterable[Extra]]] = []
        self.dropped = 0
        self.sent_messages = 0
        # On the current connection: messages sent, and (their number, events) of those
        # with events the agent has not acknowledged yet; events acknowledged in all.
        self.sent_seq = 0
        self.unacked: collections.deque[tuple[int, int]] = collections.deque()
        self.acked_events = 0
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()  # the thread and atexit may both flush
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.sock: socket.socket | None = None
        self.retry_at = 0.0

    # -- called from the training process (never on the per-batch path) ---------------
    def connect_now(self) -> None:
        """Connect before anything is sent: the agent then knows this process from its
        start (SO_PEERCRED) and sees its end, since the kernel closes the connection when
        the process dies, even one that dies before its first report (a loader worker
        killed by SIGBUS or the OOM killer on its first batch). Never raises."""
        with self.flush_lock:
            if self.sock is None:
                try:
                    self._connect()
                except Exception:
                    self.retry_at = time.monotonic() + RECONNECT_S

    def add_stream(self, stream: Stream) -> Stream:
        """A new iterator: its first report (its loader's settings and worker PIDs) goes
        at once, not a flush interval later. A worker that dies on its first batch
        (/dev/shm full, an OOM kill) is judged by the rank and the worker list the agent
        has when its connection closes: without them its death was lost."""
        with self.lock:
            self.streams.append(stream)
        self._ensure_thread()
        self.wake.set()
        return stream

    def post(self, ident: Ident, role: str, payload: Message) -> None:
        """Queue one extra message (e.g. worker samples); sent on the next flush."""
        with self.lock:
            if len(self.extra) >= 1024:
                self.dropped += 1
                return
            self.extra.append((ident, role, payload))
        self._ensure_thread()

    def add_source(self, fn: Callable[[], Iterable[Extra]]) -> None:
        """Call ``fn()`` on every flush; it returns a list of (ident, role, payload) to send.
        For hook parts that buffer their own samples (shard reads, cache lookups)."""
        with self.lock:
            self.sources.append(fn)
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            t = threading.Thread(target=self._run, name="stallscope-flush", daemon=True)
            self.thread = t
            t.start()

    # -- the flush thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self.wake.wait(FLUSH_INTERVAL_S)
            self.wake.clear()
            try:
                self.flush()
            except Exception:  # never let the thread die: the hook must keep working
                self.dropped += 1

    def flush(self) -> None:
        with self.flush_lock:
            self._flush()

    def _flush(self) -> None:
        self._read_acks()
        now = time.monotonic()
        with self.lock:
            streams = list(self.streams)
            extra, self.extra = self.extra, []
            sources = list(self.sources)
        for source in sources:
            try:
                extra.extend(source())
            except Exception:  # a buggy source loses its samples, never the flush
                self.dropped += 1
        for stream in streams:
            self._drain(stream)
            done = stream.finished() and not stream.buf
            # A next() call that has lasted BLOCKED_REPORT_S (a hang must show before its
            # batch comes); a short one in progress is most flushes of a rank that waits,
            # and no news.
            blocked = stream.blocked_since is not None and \
                now - stream.last_sent >= BLOCKED_REPORT_S and \
                time.perf_counter_ns() - stream.blocked_since >= BLOCKED_REPORT_NS
            # A worker's batch times feed the loader's sizing, not the stall's detection:
            # they go every WORKER_FLUSH_S: a rank with 8 workers sends 2 messages a
            # second, not 9 (per-message work was most of the agent's ingest CPU, issue 15).
            worker = stream.role == "worker"
            if worker:
                due = stream.pending and (now - stream.last_sent >= worker_gap(stream.sent)
                                          or moved(stream))
            else:
                due = stream.pending and (stream.sent < TRAINER_PROMPT_REPORTS
                                          or now - stream.last_sent >= TRAINER_FLUSH_S
                                          or share_moved(stream))
            beat = WORKER_FLUSH_S if worker else HEARTBEAT_S
            if due or blocked or now - stream.last_sent >= beat or done:
                self._deliver(stream, now)
            if done and not stream.pending:
                with self.lock:
                    if stream in self.streams:
                        self.streams.remove(stream)
        for ident, role, payload in extra:
            if self._send(self._message(ident, role, payload), 1) == "busy":
                self.dropped += 1

    def _deliver(self, stream: Stream, now: float) -> None:
        pending = stream.pending
        total = len(pending)
        at = 0  # events delivered (or counted as dropped) so far: taken off once, at the end
        # The report's mean load and wait share, from the running sums (wire.py Columns):
        # summing each message's slice was ~15 ns a batch of the flush thread (issue 50).
        waits, intervals = pending.sums(total)
        try:
            while True:
                n = min(total - at, wire.MAX_EVENTS_PER_MESSAGE)
                msg = self._message(stream.ident, stream.role, {"n": n})
                if pending.ready is not None:
                    msg["cols"] = pending.cols
                if stream.loader is not None:
                    msg["loader"] = stream.loader
                if stream.cuda is not None:
                    msg["cuda"] = stream.cuda
                if stream.role == "main":
                    steps = phases.get().snapshot()  # forward/backward/optimizer (phases.py)
                    if steps is not None:
                        msg["phases"] = steps
                # Said only once the call has lasted BLOCKED_REPORT_S: the agent counts it
                # before the batch comes (a hang must show), and a short next() that ends in
                # StopIteration (the last one of an epoch joins the workers) is none of its
                # business: the loop does not count it either.
                if stream.blocked_since is not None and \
                        time.perf_counter_ns() - stream.blocked_since >= BLOCKED_REPORT_NS:
                    msg["blocked_since_ns"] = stream.blocked_since
                status = self._send(msg, n, pending.block(n, at))
                if status == "busy":
                    return  # the agent is slow: keep the events for the next flush
                at += n
                stream.last_sent = now
                stream.sent += 1
                if at >= total:
                    if total:
                        stream.sent_load = waits / total
                        if intervals > 0:
                            stream.sent_share = waits / intervals
                    return
        finally:
            # One cut of the columns per delivery, not one per message: each cut moves
            # what is left (a 2 s hold of a fast loop is tens of thousands of batches).
            pending.drop_first(at)

    def _drain(self, stream: Stream) -> None:
        self.dropped += stream.drain()

    def _message(self, ident: Ident, role: str, payload: Mapping[str, object]) -> Message:
        msg: Message = {
            "v": wire.VERSION,
            "kind": "report",
            "id": ident,
            "pid": self.pid,
            "role": role,
            "mono_ns": time.perf_counter_ns(),
            "wall_ns": time.time_ns(),
            "dropped_total": self.dropped,
        }
        msg.update(payload)
        return msg

    def _send(self, msg: Message, n_events: int, events: bytes = b"") -> str:
        """Returns "sent", "busy" (agent slow: retry later) or "dropped" (counted)."""
        try:
            data = wire.encode(msg, events)
            if len(data) > wire.MAX_MESSAGE_BYTES:
                self.dropped += n_events
                return "dropped"
            sock = self.sock
            if sock is None:
                if time.monotonic() < self.retry_at:
                    self.dropped += n_events
                    return "dropped"
                sock = self._connect()
            sock.send(data, socket.MSG_NOSIGNAL)
            self.sent_messages += 1
            self.sent_seq += 1
            if n_events:
                self.unacked.append((self.sent_seq, n_events))
            return "sent"
        except BlockingIOError:
            return "busy"
        except Exception:
            # ENOENT/ECONNREFUSED: no agent; EPIPE/ECONNRESET: it went away. Drop, count,
            # and try a fresh connection after RECONNECT_S.
            self._disconnect()
            self.dropped += n_events
            return "dropped"

    def _read_acks(self) -> None:
        """Take the agent's acknowledgements (wire.py ACK); an end of stream means the
        agent closed the connection (it restarted, or found it idle): what it had not
        taken is counted as dropped and the next send connects again at once."""
        sock = self.sock
        if sock is None:
            return
        taken = -1
        try:
            while True:
                data = sock.recv(64, socket.MSG_DONTWAIT)  # never waits, whatever the socket
                if not data:
                    self._disconnect(retry_s=0.0)
                    return
                if len(data) == wire.ACK.size:
                    taken = wire.ACK.unpack(data)[0]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._disconnect()
            return
        unacked = self.unacked
        while unacked and unacked[0][0] <= taken:
            self.acked_events += unacked.popleft()[1]

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        return sock

    def _disconnect(self, retry_s: float = RECONNECT_S) -> None:
        self.retry_at = time.monotonic() + retry_s
        # Sent, never taken: lost with the connection (an agent killed with them queued).
        self.dropped += sum(n for _seq, n in self.unacked)
        self.unacked.clear()
        self.sent_seq = 0
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def close(self) -> None:
        try:
            self.flush()
        except Exception:
            pass


_channel: Channel | None = None
_channel_lock = threading.Lock()


def get() -> Channel:
    """The channel of this process (a fresh one after fork: threads do not survive it)."""
    global _channel
    ch = _channel
    if ch is None or ch.pid != os.getpid():
        with _channel_lock:
            if _channel is None or _channel.pid != os.getpid():
                _channel = Channel()
            ch = _channel
    return ch


def _after_fork() -> None:
    global _channel, _channel_lock
    _channel = None
    _channel_lock = threading.Lock()


def _at_exit() -> None:
    ch = _channel
    if ch is not None and ch.pid == os.getpid():
        ch.close()


os.register_at_fork(after_in_child=_after_fork)
atexit.register(_at_exit)
