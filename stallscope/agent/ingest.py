"""The hook socket: a unix SOCK_SEQPACKET listener served by one selector thread.

Each hook process holds one connection; each message is one JSON report (see
stallscope/hook/wire.py). The sender's PID comes from SO_PEERCRED, translated by the
kernel into the agent's PID namespace, so a process cannot claim another's PID.
Every message is validated; rejects are counted by reason and never stop the loop.
"""
from __future__ import annotations

import collections
import os
import selectors
import socket
import stat
import struct
import threading
from typing import Any, Callable, Optional, Tuple

from ..hook import wire
from . import validate

MAX_CONNECTIONS = 4096
_UCRED = struct.Struct("3i")


class BindError(Exception):
    pass


def bind(path: str) -> socket.socket:
    """Create the listening socket, replacing a stale socket file; BindError if not."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise BindError("cannot create %s: %s" % (directory, e.strerror))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise BindError("cannot bind hook socket %s: %s" % (path, e.strerror))
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise BindError("cannot bind hook socket %s: a non-socket file is in the way" % path)
        if _in_use(path):
            raise BindError("cannot bind hook socket %s: another agent is listening on it" % path)
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.bind(path)
        # Trainer pods run as other users; any process that can reach the directory may
        # report (the hostPath directory is what grants access).
        os.chmod(path, 0o666)
        sock.listen(512)
    except OSError as e:
        sock.close()
        raise BindError("cannot bind hook socket %s: %s" % (path, e.strerror))
    sock.setblocking(False)
    return sock


def _in_use(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


Apply = Callable[[Any, Optional[int], Optional[int]], Any]


class IngestStats:
    """What the ingest did, for the agent's self-health series."""

    def __init__(self) -> None:
        self.accepted = 0
        self.events = 0
        self.rejected: "collections.Counter[str]" = collections.Counter()
        self.connections = 0


class Ingest:
    """``apply(msg, peer_pid, peer_uid)`` folds one validated message into the agent
    (the composition root's: the rank table, then the parts); it raises LookupError
    when the rank table is full."""

    def __init__(self, sock: Any, apply: Apply, max_bytes: int = wire.MAX_MESSAGE_BYTES,
                 stats: Optional[IngestStats] = None) -> None:
        self.sock = sock
        self.apply = apply
        self.max_bytes = max_bytes
        self.stats = stats or IngestStats()
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.wake_r, self.wake_w = os.pipe()
        self.thread = threading.Thread(target=self._loop, name="stallscope-ingest", daemon=True)

    def start(self) -> None:
        self.selector.register(self.sock, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        os.write(self.wake_w, b"x")
        self.thread.join(timeout=5)
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, tuple) and isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
        self.selector.close()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            for key, _ in self.selector.select(timeout=1.0):
                if key.data is None:
                    self._accept()
                elif key.data != "wake" and isinstance(key.fileobj, socket.socket):
                    self._read(key.fileobj, key.data)

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
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                pid, uid, _gid = _UCRED.unpack(creds)
            except OSError:
                pid, uid = 0, None
            conn.setblocking(False)
            self.stats.connections += 1
            self.selector.register(conn, selectors.EVENT_READ, (pid, uid))

    def _read(self, conn: socket.socket, peer: Tuple[int, Optional[int]]) -> None:
        for _ in range(64):  # bounded per wake-up so one chatty peer cannot starve others
            try:
                data, _anc, flags, _addr = conn.recvmsg(self.max_bytes + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, flags = b"", 0
            if not data:  # peer closed
                self.selector.unregister(conn)
                conn.close()
                self.stats.connections -= 1
                return
            if flags & socket.MSG_TRUNC or len(data) > self.max_bytes:
                self.stats.rejected["oversize"] += 1
                continue
            self.handle(data, peer[0] or None, peer[1])

    def handle(self, data: bytes, peer_pid: Optional[int] = None, peer_uid: Optional[int] = None) -> bool:
        """Validate and apply one message; never raises."""
        try:
            msg = validate.parse(data, self.max_bytes)
            self.apply(msg, peer_pid, peer_uid)
        except validate.Reject as r:
            self.stats.rejected[r.reason] += 1
            return False
        except LookupError:
            self.stats.rejected["rank_limit"] += 1
            return False
        except Exception:  # a bug in a handler must not stop ingestion
            self.stats.rejected["internal_error"] += 1
            return False
        self.stats.accepted += 1
        self.stats.events += len(msg["events"])
        return True
