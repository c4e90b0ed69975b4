"""A bounded HTTP/1.1 server: one thread runs a ``selectors`` loop that accepts, reads
and parses requests and writes responses; a small fixed pool of workers computes them.

ThreadingHTTPServer spent a thread per connection and had no limits. Here a client
costs a socket and a few hundred bytes, so 1,000 idle or slow-loris clients cannot take
the agent's threads or memory; at most ``max_connections`` are open, and one more
evicts the connection that has waited longest for a request (idle keep-alive, or
trickling its headers), or is refused with 503 when every open one is being answered.
A request head must arrive within ``read_timeout`` (slow-loris), an idle keep-alive
connection is closed after ``idle_timeout``, an answer must be taken within
``write_timeout``. Request limits and errors: httpwire.py.

What to answer is the app's (http.py): ``dispatch(request, done)`` is called on the loop
thread and must not block; it calls ``submit(job)`` to run work on a worker (or
``submit_first(job)`` on the server's own worker, which nothing else queues on: what a
scraper asks must not wait behind the JSON API, issue 33; or ``submit_made(job)`` on
another, for answers from what the agent has made already: a rank's diagnosis from its
latest analysis must not wait behind the API's fresh ones, issue 50), and
``done(response)`` from any thread. A connection answered 429 is not read again before
its Retry-After. Nothing raises out of the loop.

With ``front=True`` (the agent's), a health responder of its own holds the listening
socket (healthd.py): it answers /healthz from the page ``health`` (the agent writes its
status there, ``beat()`` has the loop stamp its turn) and hands every other connection
over unread, which the loop adopts as if it had accepted it. Should the responder fail
to start or die, the loop accepts again itself, and answers /healthz as before.
"""
from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Any, Callable

from ...host import log
from . import healthd, httpwire
from .httppool import Inbox, Stats, Workers
from .httpwire import HttpError, Request, Response

READ, BUSY, WRITE, DRAIN, PAUSED = "read", "busy", "write", "drain", "paused"
LINGER = 1.0  # after a closing answer: read and drop what the client still sends (see _write)
REFUSING = 64  # refused connections lingering over the bound at once; more are just closed


class Conn:
    __slots__ = ("sock", "inbuf", "out", "state", "deadline", "keep", "events", "refused", "resume")

    def __init__(self, sock: socket.socket, now: float, read_timeout: float) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.out: list[memoryview] = []
        self.state = READ
        self.deadline = now + read_timeout      # a new client sends its request at once
        self.keep = True
        self.events = 0
        self.refused = False
        self.resume = 0.0  # after a 429: nothing more is read from it before then


class Server:
    def __init__(self, addr: tuple[str, int], dispatch: Callable[[Request, Callable[[Response], None]], None],
                 workers: int = 4, max_connections: int = 256, read_timeout: float = 5.0,
                 idle_timeout: float = 75.0, write_timeout: float = 30.0,
                 stats: Stats | None = None, front: bool = False) -> None:
        self.dispatch = dispatch
        self.max_connections = max_connections
        self.read_timeout, self.idle_timeout, self.write_timeout = read_timeout, idle_timeout, write_timeout
        self.stats = stats or Stats()
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(addr)
            self.socket.listen(1024)  # a burst of connects waits in the kernel, not in SYN retries
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._inbox = Inbox()
        self._pool = Workers(workers, "stallscope-http-worker")
        self._first = Workers(1, "stallscope-http-first")
        self._made = Workers(1, "stallscope-http-made")
        # from any thread: run a job on a worker, or on the worker only /metrics uses;
        # run a function on the loop thread
        self.submit: Callable[[Callable[[], None]], None] = self._pool.submit
        self.submit_first: Callable[[Callable[[], None]], None] = self._first.submit
        self.submit_made: Callable[[Callable[[], None]], None] = self._made.submit
        self.call_soon: Callable[[Callable[[], None]], None] = self._inbox.post
        self._conns: dict[int, Conn] = {}
        self._waiting: dict[int, Conn] = {}     # READ state, longest waiting first: who to evict
        self._refusing = 0
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._serving = False
        self._closed = False
        # the health responder's (front=True): the page the agent writes, the process, and
        # the socket pair's end its connections come over
        self.health: healthd.HealthPage | None = healthd.HealthPage.create() if front else None
        self._front: Any = None
        self._handoff: socket.socket | None = None

    def serve_forever(self) -> None:
        """Serve until shutdown(); on return every worker has ended and every client
        connection is closed."""
        if self._stop.is_set():  # shut down before it started
            self._done.set()
            return
        self._serving = True
        self._pool.start()
        self._first.start()
        self._made.start()
        try:
            if self.health is not None:
                self._start_front()
            if self._handoff is None:
                self._sel.register(self.socket, selectors.EVENT_READ, None)
            self._sel.register(self._inbox, selectors.EVENT_READ, None)
            while not self._stop.is_set():
                try:
                    for key, events in self._sel.select(timeout=self._until_deadline()):
                        self._event(key.fileobj, key.data, events)
                    now = time.monotonic()
                    if self.health is not None:  # this loop's turn, for the responder's answer
                        self.health.beat_loop()
                    self._sweep(now)
                except Exception as e:  # nothing raises out of the loop
                    log("http loop: %s: %s" % (type(e).__name__, e))
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            self._stop_front()
            self._pool.stop()
            self._first.stop()
            self._made.stop()
            self._done.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait for it to end (at once if it never ran)."""
        self._stop.set()
        self.call_soon(lambda: None)
        if self._serving:
            self._done.wait()

    def server_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_front()
        self.socket.close()
        self._inbox.close()
        self._sel.close()
        if self.health is not None:
            self.health.close()
            self.health = None

    def beat(self) -> None:
        """From any thread: wake the loop, which stamps its turn on the health page (an
        idle loop sleeps until a deadline, and a stale stamp is a 503)."""
        self.call_soon(lambda: None)

    # -- the health responder -----------------------------------------------------------
    def _start_front(self) -> None:
        assert self.health is not None
        self.health.beat_loop()
        try:
            self._front, self._handoff = healthd.spawn(self.socket, self.health)
        except OSError as e:
            log("health responder: cannot start (%s): /healthz is answered by the HTTP loop" % e)
            return
        self._sel.register(self._handoff, selectors.EVENT_READ, None)

    def _adopt(self) -> None:
        """The connections the responder accepted and handed over, every byte unread."""
        assert self._handoff is not None
        for _ in range(64):  # then let the other sockets have a turn
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._handoff, 16, 16, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:  # it is gone: accept again here
                log("health responder exited: /healthz is answered by the HTTP loop")
                self._stop_front()
                self._sel.register(self.socket, selectors.EVENT_READ, None)
                return
            for fd in fds:
                self._take(socket.socket(fileno=fd))

    def _stop_front(self) -> None:
        handoff, proc = self._handoff, self._front
        self._handoff = self._front = None
        if handoff is not None:
            try:
                self._sel.unregister(handoff)
            except (KeyError, ValueError, RuntimeError):  # not registered, or closed
                pass
            handoff.close()  # the responder exits at its end's EOF
        if proc is not None:
            healthd.stop(proc)

    # -- the loop -------------------------------------------------------------------
    def _event(self, sock: Any, conn: Conn | None, events: int) -> None:
        if conn is None:  # the listening socket, the inbox or the health responder's pair
            if sock is self.socket:
                self._accept()
            elif sock is self._handoff:
                self._adopt()
            else:
                self._inbox.run()
            return
        try:
            if events & selectors.EVENT_READ:
                self._drain(conn) if conn.state == DRAIN else self._read(conn)
            if events & selectors.EVENT_WRITE and conn.state == WRITE:
                self._write(conn)
        except OSError:  # reset, broken pipe: the client is gone
            self._close(conn)

    def _want(self, conn: Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _accept(self) -> None:
        for _ in range(64):  # then let the other sockets have a turn
            try:
                sock, _addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: drop nothing, retry next turn
                log("http accept: %s" % e)
                return
            self._take(sock)

    def _take(self, sock: socket.socket) -> None:
        """A client's connection, accepted here or by the health responder."""
        sock.setblocking(False)
        # an answer is one write, but a partial one's tail must not wait for an ACK (Nagle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        full = len(self._conns) >= self.max_connections and not self._evict()
        if full and self._refusing >= REFUSING:
            self.stats.dropped["refused"] += 1
            sock.close()
            return
        conn = Conn(sock, time.monotonic(), self.read_timeout)
        self._conns[sock.fileno()] = conn
        self.stats.open = len(self._conns)
        if full:
            self._refuse(conn)
            return
        self._waiting[sock.fileno()] = conn
        self._want(conn, selectors.EVENT_READ)
        # A client sends its request with its connect (a liveness probe does): read
        # it now, not at the loop's next turn, which under load waits for the
        # interpreter's lock once more (issue 50: /healthz waited twice per answer).
        try:
            self._read(conn)
        except BlockingIOError:
            pass
        except OSError:
            self._close(conn)

    def _evict(self) -> bool:
        """Close the connection waiting longest for a request (idle, or a slow-loris)."""
        if not self._waiting:
            return False
        oldest = next(iter(self._waiting.values()))
        self.stats.dropped["evicted"] += 1
        self._close(oldest)
        return True

    def _refuse(self, conn: Conn) -> None:
        """Every open connection is being answered: 503 at once, then closed as any
        closing answer is (lingering a second, so that the 503 is not reset)."""
        self.stats.dropped["refused"] += 1
        self._refusing += 1
        conn.refused, conn.keep = True, False
        self._respond(conn, None, httpwire.error(503, "too many connections"))

    def _read(self, conn: Conn) -> None:
        data = conn.sock.recv(65536)
        if not data:
            self._close(conn)
            return
        if not conn.inbuf:  # a request's first byte: its head must follow within read_timeout
            # (of it, or of the accept if sooner: a new client cannot wait, then trickle)
            conn.deadline = min(conn.deadline, time.monotonic() + self.read_timeout)
        conn.inbuf += data
        self._parse(conn)

    def _parse(self, conn: Conn) -> None:
        try:
            end = httpwire.head_end(conn.inbuf)
            if end < 0:
                return
            head = bytes(conn.inbuf[:end])
            del conn.inbuf[:end]
            request = httpwire.parse(head)
        except HttpError as e:
            conn.keep = False
            return self._respond(conn, None, httpwire.error(e.status, e.reason, e.allow))
        conn.keep = request.keep_alive
        conn.state = BUSY
        self._waiting.pop(conn.sock.fileno(), None)
        self._want(conn, 0)  # nothing more is read until this request is answered (pipelining)
        fd = conn.sock.fileno()

        def done(response: Response) -> None:
            self.call_soon(lambda: self._respond(conn, request, response, fd))
        try:
            self.dispatch(request, done)
        except Exception as e:
            self._respond(conn, request, httpwire.error(500, "internal error: %s" % type(e).__name__))

    def _respond(self, conn: Conn, request: Request | None, r: Response, fd: int = -1) -> None:
        if fd >= 0 and self._conns.get(fd) is not conn:
            return  # closed while its answer was computed (shutdown)
        klass = "%dxx" % (r.status // 100)
        if klass in self.stats.requests:  # never a new key: a scrape may be reading the dict
            self.stats.requests[klass] += 1
        asked = request is not None and request.version == "HTTP/1.0" and conn.keep
        if r.status == 429 and r.retry_after:
            conn.resume = time.monotonic() + r.retry_after
        conn.out = [memoryview(httpwire.encode_head(r, conn.keep, asked))]
        if request is None or request.method != "HEAD":
            conn.out.append(memoryview(r.body))
        conn.state = WRITE
        self._waiting.pop(conn.sock.fileno(), None)
        conn.deadline = time.monotonic() + self.write_timeout
        self._want(conn, selectors.EVENT_WRITE)
        try:
            self._write(conn)  # most answers fit the socket buffer: no extra turn of the loop
        except OSError:
            self._close(conn)

    def _write(self, conn: Conn) -> None:
        sent = conn.sock.sendmsg(conn.out)
        while sent and conn.out:
            n = min(sent, len(conn.out[0]))
            sent -= n
            conn.out[0] = conn.out[0][n:]
            if not len(conn.out[0]):
                conn.out.pop(0)
        if conn.out:
            return
        now = time.monotonic()
        if not conn.keep:
            # Closing with unread request bytes in the kernel would reset the connection
            # and could destroy the answer before the client reads it: half-close, then
            # read and drop what still comes, for a moment (a "lingering close").
            conn.sock.shutdown(socket.SHUT_WR)
            conn.state, conn.deadline = DRAIN, now + LINGER
            conn.inbuf.clear()
            self._want(conn, selectors.EVENT_READ)
            return
        self._waiting[conn.sock.fileno()] = conn
        if conn.resume > now:
            # Told to retry after a while: its next request is not read before then, so a
            # client that asks again at once costs the loop nothing meanwhile (issue 50:
            # 50 such clients made it answer 1,300 429s a second, and /healthz waited).
            conn.state, conn.deadline = PAUSED, conn.resume
            self._want(conn, 0)
            return
        self._resume(conn, now)

    def _resume(self, conn: Conn, now: float) -> None:
        conn.state = READ
        conn.deadline = now + (self.read_timeout if conn.inbuf else self.idle_timeout)
        self._want(conn, selectors.EVENT_READ)
        if conn.inbuf:  # a pipelined request already here
            self._parse(conn)

    def _drain(self, conn: Conn) -> None:
        if not conn.sock.recv(65536):
            self._close(conn)

    def _until_deadline(self) -> float | None:
        """Seconds to the nearest deadline of a connection not being answered (None: no
        such connection; a busy one's answer comes through the inbox, which wakes the
        loop). The loop sleeps until then: it woke every 0.25 s with nothing to do, and a
        wake-up costs ~0.06-0.2 ms of CPU on a VM (FIELD-NOTES, issue 31)."""
        deadlines = [c.deadline for c in self._conns.values() if c.state != BUSY]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic()) + 0.005

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.state != BUSY and now >= c.deadline]:
            if conn.state == PAUSED:
                try:
                    self._resume(conn, now)
                except OSError:
                    self._close(conn)
                continue
            if conn.state == READ and conn.inbuf:
                conn.keep = False  # a partial request that stalled: say so, then close
                self.stats.dropped["timeout"] += 1
                self._respond(conn, None, httpwire.error(408, "request not received in %gs"
                                                         % self.read_timeout))
                continue
            if conn.state != DRAIN:
                self.stats.dropped["idle" if conn.state == READ else "timeout"] += 1
            self._close(conn)

    def _close(self, conn: Conn) -> None:
        fd = conn.sock.fileno()
        if conn.refused and fd >= 0:
            self._refusing -= 1
        if fd >= 0:
            self._conns.pop(fd, None)
            self._waiting.pop(fd, None)
            self._want(conn, 0)
        conn.sock.close()
        conn.out, conn.state = [], "closed"
        self.stats.open = len(self._conns)
