"""Scrapes before analysis: while /metrics renders, the correlator's loops over ranks
wait for the render to end before their next rank.

Both hold the GIL. At 256 ranks a correlator tick holds it ~100 ms a second, and a full
analysis of every rank for several hundred ms; a render that shares the GIL with it
(5 ms turns, sys.getswitchinterval) takes two to three times its own 40 ms, and a scrape
that met a full analysis waited 400 ms (p99 of 121 scrapes, one a second,
benchmarks/bench_http.py --scrapers 1 --interval 1: issue 14's goal is 250 ms). An
analysis a few tens of ms later changes nothing; a scrape that times out loses a sample.

The loops call ``pause()`` between ranks: nothing when no render is in progress, else it
waits for the render (at most WAIT_S), and then runs at least RUN_S before it waits again,
so back-to-back scrapes (50 scrapers in a closed loop) slow the analysis down without
stopping it.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

WAIT_S = 0.5
RUN_S = 0.02


class ScrapeFirst:
    def __init__(self, wait_s: float = WAIT_S, run_s: float = RUN_S) -> None:
        self.wait_s, self.run_s = wait_s, run_s
        self._lock = threading.Lock()
        self._renders = 0
        self._idle = threading.Event()
        self._idle.set()
        self._resumed = 0.0
        self.waits = 0  # pauses that waited for a render (tests, and a look in a debugger)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        with self._lock:
            self._renders += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._renders -= 1
                if not self._renders:
                    self._idle.set()

    def pause(self) -> None:
        if self._idle.is_set():
            return
        if time.monotonic() - self._resumed < self.run_s:
            return
        self.waits += 1
        self._idle.wait(self.wait_s)
        self._resumed = time.monotonic()


SCRAPES = ScrapeFirst()  # one per process: the agent's server and its correlator
