"""The health responder (issue 50): a small process of the agent's own that holds its
listening socket, answers ``/healthz`` itself and hands every other connection to the
agent unread (SCM_RIGHTS over a socket pair; httpserver.py adopts them).

Why a process: under API load the agent's threads hold the interpreter's lock for tens
of milliseconds at a time (a JSON body encoded, an analysis in numpy, the exposition),
and a health check answered on any thread of the agent waits behind them
(benchmarks/bench_health.py at 256 ranks under 50 closed-loop API clients: p99 117 ms
answered on the HTTP loop thread, against a goal of 100 ms). This process runs no agent
code: the standard library only, one thread, nothing but accepting, peeking at a request
line and answering from a page of shared memory the agent writes (``HealthPage``): the
agent's status (``Agent.healthy``, written every HEALTH_BEAT_S by its jobs thread) and
its HTTP loop's last turn. Either older than STALE_S is a 503 that names what stopped,
so a wedged agent is still restarted by its liveness probe.

A connection is classified by peeking (MSG_PEEK) at its first bytes: ``GET /healthz``
or ``HEAD /healthz`` is answered here and closed (a probe opens a connection a probe);
anything else goes to the agent with every byte still unread, so the agent's server
parses it as if it had accepted it (its limits, timeouts and answers unchanged). A
keep-alive connection stays the agent's: a /healthz on it is answered there, as before.

Run by the agent as a script (``python -I healthd.py LISTEN_FD HANDOFF_FD PAGE_FD PID``: not
as a module of the package, whose import loads the hook) and counted in its cost
(``running``: api.py's /api/v1/agent). It exits when the agent's end of the socket pair
closes (the agent stopped or died).
"""
from __future__ import annotations

import collections
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    import subprocess

# The page: a sequence count (odd while the status is being written), when the status
# was written, the HTTP loop's last turn (CLOCK_MONOTONIC ns), the status code, the
# length of its text; then the text. The loop's beat is one aligned 8-byte field of its
# own, written by its own thread, outside the count.
HEAD = struct.Struct("=QqqII")
AT, LOOP_AT, CODE_AT = 8, 16, 24
PAGE_BYTES = 4096
MAX_TEXT = PAGE_BYTES - HEAD.size
# The agent writes its status this often (its jobs thread) and wakes its HTTP loop as
# often; either silent for STALE_S is a 503. The DaemonSet's liveness probe asks every
# 20 s and restarts after 3 failures: an agent wedged for about a minute goes.
HEALTH_BEAT_S = 1.0
STALE_S = 15.0
PEEK = 16              # bytes enough to tell "HEAD /healthz?" from anything else
DECIDE_S = 1.0         # a connection still undecided then goes to the agent (its own
                       # read timeout then, and its 408)
READ_TIMEOUT_S = 5.0   # a health request's head must have come by then
RECHECK_S = 0.02       # a request line too short yet to tell is peeked at again then
MAX_UNDECIDED = 512    # past this, a new connection goes to the agent at once
MAX_QUEUED = 4096      # connections waiting for the agent to take them; past it, closed
HEALTH = (b"GET /healthz", b"HEAD /healthz")


class HealthPage:
    """The shared page: the agent writes, the responder reads. One writer of the status
    (the jobs thread), one of the loop's beat (the HTTP loop thread)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.map = mmap.mmap(fd, PAGE_BYTES)
        self.seq = HEAD.unpack_from(self.map)[0]
        self.last: tuple[int, int, bytes] = (0, 0, b"")  # the reader's last whole status

    @classmethod
    def create(cls) -> HealthPage:
        fd = os.memfd_create("stallscope-health", os.MFD_CLOEXEC)
        os.ftruncate(fd, PAGE_BYTES)
        return cls(fd)

    def write(self, ok: bool, text: str, now_ns: int | None = None) -> None:
        body = text.encode("utf-8", "replace")[:MAX_TEXT]
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        self.seq += 1  # odd: a reader that sees it (or a change) reads again
        struct.pack_into("=Q", self.map, 0, self.seq)
        struct.pack_into("=q", self.map, AT, now_ns)
        struct.pack_into("=II", self.map, CODE_AT, 200 if ok else 503, len(body))
        self.map[HEAD.size:HEAD.size + len(body)] = body
        self.seq += 1
        struct.pack_into("=Q", self.map, 0, self.seq)

    def beat_loop(self, now_ns: int | None = None) -> None:
        struct.pack_into("=q", self.map, LOOP_AT, time.monotonic_ns() if now_ns is None else now_ns)

    def read(self) -> tuple[int, int, int, bytes]:
        """(status written at, loop's beat, code, text); code 0: never written. A write
        in progress (its thread may wait for the agent's interpreter lock between two
        fields) leaves the last status read whole, with the loop's beat of now."""
        for _ in range(3):
            seq, at, _, code, n = HEAD.unpack_from(self.map)
            text = self.map[HEAD.size:HEAD.size + min(n, MAX_TEXT)]
            if not seq & 1 and struct.unpack_from("=Q", self.map)[0] == seq:
                self.last = (at, code, text)
                break
        at, code, text = self.last
        return at, struct.unpack_from("=q", self.map, LOOP_AT)[0], code, text

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def answer(page: HealthPage, now_ns: int) -> tuple[int, bytes]:
    """The /healthz answer: the agent's own status while it and its HTTP loop are
    alive, else 503 naming what stopped."""
    at, loop, code, text = page.read()
    if not code:
        return 503, b"stallscope agent: starting\n"
    for name, when in (("jobs thread", at), ("HTTP loop", loop)):
        idle = (now_ns - when) / 1e9
        if idle > STALE_S:
            return 503, b"stallscope agent: its %s has not run for %.0f s\n" % (name.encode(), idle)
    return code, bytes(text) + b"\n"


def kind(data: bytes) -> str:
    """"health", "other", or "wait" (too few bytes yet to tell)."""
    for prefix in HEALTH:
        if data.startswith(prefix):
            rest = data[len(prefix):len(prefix) + 1]
            if not rest:
                return "wait"
            return "health" if rest in (b" ", b"?") else "other"
        if prefix.startswith(data):
            return "wait"
    return "other"


def response(code: int, body: bytes, head_only: bool) -> bytes:
    phrase = b"OK" if code == 200 else b"Service Unavailable"
    head = (b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (code, phrase, len(body)))
    return head if head_only else head + body


class Pending:
    """A connection not yet answered nor handed over."""

    __slots__ = ("sock", "deadline", "got", "recheck")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.got: bytearray | None = None  # a health request's head so far (once known)
        # A request line too short yet to tell stays unread in the socket, which a
        # selector would report ready at every turn: it is peeked at again then instead.
        self.recheck: float | None = None


class Responder:
    def __init__(self, listen: socket.socket, handoff: socket.socket, page: HealthPage) -> None:
        self.listen, self.handoff, self.page = listen, handoff, page
        listen.setblocking(False)
        handoff.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(listen, selectors.EVENT_READ, "listen")
        self.sel.register(handoff, selectors.EVENT_READ, "agent")
        self.undecided: dict[int, Pending] = {}
        self.queue: collections.deque[socket.socket] = collections.deque()
        self.running = True

    def run(self) -> None:
        while self.running:
            timeout = None
            if self.undecided:
                soonest = min(p.deadline if p.recheck is None else min(p.deadline, p.recheck)
                              for p in self.undecided.values())
                timeout = max(0.0, soonest - time.monotonic()) + 0.001
            for key, events in self.sel.select(timeout):
                try:
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "agent":
                        self._agent(events)
                    else:
                        self._decide(key.fileobj)  # type: ignore[arg-type]
                except OSError:
                    if key.data not in ("listen", "agent"):
                        self._drop(key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            for p in list(self.undecided.values()):
                if now >= p.deadline:
                    # still undecided: the agent's server answers it (its read timeout
                    # and 408 then); a health request whose head trickles is closed
                    self._forget(p.sock)
                    if p.got is None:
                        self._hand(p.sock)
                    else:
                        p.sock.close()
                elif p.recheck is not None and now >= p.recheck:
                    try:
                        self._decide(p.sock)
                    except OSError:
                        self._drop(p.sock)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _ = self.listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and friends: the next turn tries again
                return
            sock.setblocking(False)
            if len(self.undecided) >= MAX_UNDECIDED:
                self._hand(sock)
                continue
            self.undecided[sock.fileno()] = Pending(sock, time.monotonic() + DECIDE_S)
            self.sel.register(sock, selectors.EVENT_READ, "client")
            try:
                self._decide(sock)  # a probe sends its request with its connect
            except OSError:
                self._drop(sock)

    def _decide(self, sock: socket.socket) -> None:
        p = self.undecided.get(sock.fileno())
        if p is None:
            return
        if p.got is None:  # not yet known: peek, consuming nothing the agent would need
            try:
                data = sock.recv(PEEK, socket.MSG_PEEK)
            except BlockingIOError:
                return
            if not data:
                return self._drop(sock)
            what = kind(data)
            if what == "wait":
                if p.recheck is None:
                    self.sel.unregister(sock)
                p.recheck = time.monotonic() + RECHECK_S
                return
            if what == "other":
                self._forget(sock)
                return self._hand(sock)
            if p.recheck is not None:
                self.sel.register(sock, selectors.EVENT_READ, "client")
                p.recheck = None
            p.got = bytearray()
            p.deadline += READ_TIMEOUT_S - DECIDE_S
        try:  # a health request: its head is read here, then answered
            data = sock.recv(8192)
        except BlockingIOError:
            return
        if not data:
            return self._drop(sock)
        p.got += data
        if b"\r\n\r\n" not in p.got and b"\n\n" not in p.got:
            if len(p.got) > 8192:
                self._drop(sock)
            return
        code, body = answer(self.page, time.monotonic_ns())
        self._forget(sock)
        try:
            sock.send(response(code, body, p.got.startswith(b"HEAD")))
        except OSError:
            pass
        sock.close()

    def _forget(self, sock: socket.socket) -> None:
        p = self.undecided.pop(sock.fileno(), None)
        if p is not None and p.recheck is None:
            self.sel.unregister(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._forget(sock)
        sock.close()

    def _hand(self, sock: socket.socket) -> None:
        """To the agent, every byte unread; queued while its end is full."""
        if self.queue or not self._send(sock):
            if len(self.queue) >= MAX_QUEUED:
                sock.close()
                return
            if not self.queue:
                self.sel.modify(self.handoff, selectors.EVENT_READ | selectors.EVENT_WRITE, "agent")
            self.queue.append(sock)

    def _send(self, sock: socket.socket) -> bool:
        try:
            socket.send_fds(self.handoff, [b"c"], [sock.fileno()])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:  # the agent is gone: run() ends at its EOF
            pass
        sock.close()
        return True

    def _agent(self, events: int) -> None:
        if events & selectors.EVENT_READ:
            try:
                if not self.handoff.recv(16):
                    self.running = False  # the agent closed its end: stopped or died
                    return
            except BlockingIOError:
                pass
        if events & selectors.EVENT_WRITE:
            while self.queue and self._send(self.queue[0]):
                self.queue.popleft()
            if not self.queue:
                self.sel.modify(self.handoff, selectors.EVENT_READ, "agent")


# -- the agent's side --------------------------------------------------------------------
_RUNNING: dict[int, subprocess.Popen[bytes]] = {}  # pid -> the responders this process started


def spawn(listen: socket.socket, page: HealthPage) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a responder on ``listen``; returns it and the agent's end of the socket pair
    (the connections it hands over arrive there). OSError if it cannot start."""
    import subprocess

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        fds = (listen.fileno(), theirs.fileno(), page.fd)
        proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), *map(str, fds),
                                 str(os.getpid())],
                                pass_fds=fds, stdin=subprocess.DEVNULL, close_fds=True)
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    _RUNNING[proc.pid] = proc
    mine.setblocking(False)
    return proc, mine


def stop(proc: subprocess.Popen[bytes], timeout: float = 2.0) -> None:
    """After the agent's end of the pair is closed: the responder exits on its own."""
    import subprocess

    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _RUNNING.pop(proc.pid, None)


def running() -> list[int]:
    """PIDs of the responders this process runs (its cost is the agent's: api.py)."""
    return [pid for pid, proc in list(_RUNNING.items()) if proc.poll() is None]


def _die_with(agent: int) -> None:
    """Killed with the agent's thread that started it (its HTTP loop), at once: a test's
    check for processes left behind must not find it in the instant before its EOF."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux's libc: the EOF alone ends it
        pass
    if os.getppid() != agent:  # gone before the prctl took
        sys.exit(0)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the agent's to handle
    listen_fd, handoff_fd, page_fd, agent = (int(a) for a in argv)
    _die_with(agent)
    listen = socket.socket(fileno=listen_fd)
    handoff = socket.socket(fileno=handoff_fd)
    Responder(listen, handoff, HealthPage(page_fd)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
