"""What surrounds the HTTP server's loop (httpserver.py): the fixed pool of workers
that compute answers, the inbox by which they hand work back to the loop thread, and
the server's counters.
"""
from __future__ import annotations

import collections
import queue
import socket
import threading
import time
from typing import Callable

from ...host import log

Job = Callable[[], None]


class Stats:
    """The server's counters (the ``stallscope_agent_http_*`` metrics); the loop thread
    writes them, a scrape reads them. Every key exists from the start."""

    DROPPED = ("evicted", "refused", "idle", "timeout")
    CLASSES = ("2xx", "4xx", "5xx")

    def __init__(self) -> None:
        self.open = 0
        self.dropped = dict.fromkeys(self.DROPPED, 0)
        self.requests = dict.fromkeys(self.CLASSES, 0)


class Workers:
    """``n`` threads taking jobs in order; a job's exception is logged, never lost with
    the thread. stop() lets the queued jobs finish first (a render at most: /metrics
    renders are single-flight, other routes answer in milliseconds)."""

    def __init__(self, n: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name="%s-%d" % (name, i), daemon=True)
                         for i in range(n)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every worker to end after the jobs queued; wait ``timeout`` in all, not
        each (a stop waits for one slow job, not for one per thread): the threads are
        daemons, and one still busy then ends with the process."""
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as e:  # the app's jobs catch their own; this is a last guard
                log("http worker: %s: %s" % (type(e).__name__, e))


class Inbox:
    """Functions for the loop thread to run, from any thread: queued, and the loop's
    select() woken by a byte on a socket pair it watches (``fileno``)."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._posted: collections.deque[Job] = collections.deque()

    def fileno(self) -> int:
        return self._r.fileno()

    def post(self, fn: Job) -> None:
        self._posted.append(fn)
        try:
            self._w.send(b"\0")
        except OSError:  # full: the loop is awake anyway; closed: stopping
            pass

    def run(self) -> None:
        """On the loop thread: clear the wake-up bytes, run what was posted."""
        try:
            while self._r.recv(4096):
                pass
        except OSError:  # nothing more to read
            pass
        while self._posted:
            fn = self._posted.popleft()
            try:
                fn()
            except Exception as e:
                log("http loop: %s: %s" % (type(e).__name__, e))

    def close(self) -> None:
        self._r.close()
        self._w.close()
