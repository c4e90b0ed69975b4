"""Runs the exporters off the scrape path, each in its own thread, and serves their
last results to /metrics.

Isolation (one that fails or hangs never fails the scrape or stalls the
others): a tick of the agent's scheduler only starts a pass over the exporters' threads;
a scrape only reads what the threads left. An exporter still running when the next tick
comes is not started again; once past its deadline it reports success 0, its series are
withheld until it returns, and the pass goes on without it. A dead FUSE mount can hold a
thread in D state forever; it then holds exactly that one thread.

A pass is a relay: one exporter collects at a time, and its thread, done, wakes the
next one's. Run together, every read of a file handed the interpreter's lock to another
exporter's thread and back (~145 context switches a second in the agent at 8 ranks x 8
workers; issue 31); woken together and queued on a lock, each thread still woke about six
times a collection for its one run (tick, lock, interpreter lock), ~3 wake-ups a second
for each of a dozen exporters that collect every 2 s: most of a small exporter's cost.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..host import Part, Query, log
from ..host.contract import no_params
from ..host.families import family
from ..host.options import flag
from .base import Exporter

STOP_CHECK_S = 30.0


@dataclasses.dataclass(frozen=True)
class ExportersOptions:
    interval: float = flag(2.0, "--exporter.interval",
                           "How often every exporter collects (off the scrape path; /metrics "
                           "serves the last collection).", lo=0.1, hi=3600, metavar="SECONDS")
    timeout: float = flag(2.0, "--exporter.timeout",
                          "Deadline of one collection; an exporter past it reports "
                          "stallscope_exporter_success 0 and is not started again until it "
                          "returns.", lo=0.05, hi=3600, metavar="SECONDS")


class Slot:
    """One exporter's thread, schedule and last result."""

    def __init__(self, name: str, exporter: Exporter, explicit: bool) -> None:
        self.name = name
        self.exporter = exporter
        self.explicit = explicit       # the user asked for it with --exporter.NAME
        self.trigger = threading.Event()
        self.lock = threading.Lock()   # a run's results are published, and read, as one
        self.thread = None
        self.running_since = None      # time.monotonic() of the run in progress
        self.families = []
        self.success = None            # None until the first run ends
        self.duration = 0.0
        self.error = None
        self.available = None
        self.reason = None
        self.runs = 0
        self.failures = 0
        self.overdue_noted = False


class Runner(Part):
    """Part ``exporters``: the exporters' threads, schedule and self-health."""

    name = "exporters"

    def __init__(self, host: Any, exporters: Sequence[tuple[Exporter, bool]],
                 options: ExportersOptions = ExportersOptions()) -> None:
        """exporters: [(Exporter instance, explicitly enabled)]."""
        super().__init__(host)
        self.interval = options.interval
        self.deadline = options.timeout
        self.slots = [Slot(e.name, e, x) for e, x in exporters]
        self.relay = threading.Lock()  # guards the pass: what is left of it, who runs now
        self.left: list[Slot] = []     # the pass's exporters not yet started, in order
        self.current: Slot | None = None  # the one collecting in this pass
        for e, _ in exporters:
            e.deadline = self.deadline

    # -- scheduling ---------------------------------------------------------------
    def tick(self) -> None:
        """Start a pass over the idle exporters, or move one on past an exporter stuck
        beyond its deadline (called by the agent's scheduler); never blocks."""
        now = time.monotonic()
        for slot in self.slots:
            since = slot.running_since
            if since is not None and now - since > self.deadline and not slot.overdue_noted:
                slot.overdue_noted = True
                log("exporter %s: still running after %.1fs (deadline %.1fs); "
                    "not started again until it returns" % (slot.name, now - since, self.deadline))
        with self.relay:
            current = self.current
            if current is not None:
                since = current.running_since
                if since is not None and now - since <= self.deadline:
                    return  # the pass goes on
                self.current = None  # stuck past its deadline: the pass goes on without it
            if not self.left:
                self.left = [slot for slot in self.slots if slot.running_since is None]
            self._start_next()

    def _start_next(self) -> None:
        """Wake the next exporter of the pass that is not running (under ``relay``)."""
        while self.left:
            slot = self.left.pop(0)
            if slot.running_since is not None:
                continue  # still stuck from an earlier pass: not started again
            slot.running_since = time.monotonic()
            self.current = slot
            if slot.thread is None:
                slot.thread = threading.Thread(target=self._loop, args=(slot,), daemon=True,
                                               name="stallscope-exporter-" + slot.name)
                slot.thread.start()
            slot.trigger.set()
            return

    def _loop(self, slot):
        # Woken by the relay only: a timed wait that woke every second to look at
        # ``stopping`` was most of an idle exporter's cost (a wake-up is ~0.1 ms of CPU on
        # a VM, and the agent has a dozen exporters); the thread is a daemon, and ends
        # within STOP_CHECK_S of the agent stopping.
        while not self.host.stopping.is_set():
            if slot.trigger.wait(STOP_CHECK_S):
                slot.trigger.clear()
                self.run_once(slot)
                with self.relay:
                    if self.current is slot:  # not passed over meanwhile: hand on
                        self.current = None
                        self._start_next()

    def run_once(self, slot):
        """One collection of one exporter, in the calling thread."""
        slot.running_since = slot.running_since or time.monotonic()
        self._collect(slot, slot.exporter)

    def _collect(self, slot, exp):
        start = time.monotonic()
        families, error, reason, checked = [], None, None, False
        try:
            reason = exp.unavailable()
            checked = True
            if reason is None:
                families = list(exp.collect() or ())
        except Exception as e:  # an exporter's bug or I/O error fails that exporter only
            error = "%s: %s" % (type(e).__name__, e)
        duration = time.monotonic() - start
        late = duration > self.deadline
        if late and error is None:
            error = "took %.2fs, over the %.2fs deadline" % (duration, self.deadline)
        # Availability, success and the series are published together, so a reader
        # (/metrics, /api/v1/exporters) never sees one of them updated without the rest.
        with slot.lock:
            if checked:
                self._availability(slot, reason)
            if slot.available is False:
                ok = not slot.explicit
            else:
                ok = error is None
            if error and error != slot.error:
                log("exporter %s failed: %s" % (slot.name, error))
            slot.families = families
            slot.error = error
            slot.success = ok
            slot.duration = duration
            slot.runs += 1
            slot.failures += 0 if ok else 1
            slot.overdue_noted = False
            slot.running_since = None

    def _availability(self, slot, reason):
        if reason == slot.reason and slot.available is not None:
            return
        slot.available, slot.reason = reason is None, reason
        if reason is not None:
            if slot.explicit:
                log("exporter %s: enabled with --exporter.%s but not available on this "
                         "node: %s" % (slot.name, slot.name, reason))
            else:
                log("exporter %s: not available on this node (%s); skipped" % (slot.name, reason))
        elif slot.runs:
            log("exporter %s: available again" % slot.name)

    def collect_now(self):
        """Run every exporter once, in this thread (tests and the benchmark)."""
        for slot in self.slots:
            self.run_once(slot)

    # -- serving ------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        now = time.monotonic()
        ok = family("stallscope_exporter_success")
        dur = family("stallscope_exporter_duration_seconds")
        avail = family("stallscope_exporter_available")
        for slot in self.slots:
            with slot.lock:
                since, success, duration = slot.running_since, slot.success, slot.duration
                families, available = slot.families, slot.available
            if since is not None and now - since > self.deadline:
                ok.add({}, 0, exporter=slot.name)
                dur.add({}, now - since, exporter=slot.name)
            elif success is not None:
                ok.add({}, 1 if success else 0, exporter=slot.name)
                dur.add({}, duration, exporter=slot.name)
                yield from families
            if available is not None:
                avail.add({}, 1 if available else 0, exporter=slot.name)
        yield from (ok.family, dur.family, avail.family)

    def routes(self) -> dict[str, Any]:
        return {"/api/v1/exporters": self._status_route}

    def _status_route(self, query: Query) -> tuple[int, Any]:
        no_params(query)
        return 200, {"exporters": self.status()}

    def status(self) -> list[dict[str, Any]]:
        """State of every exporter for /api/v1/exporters."""
        now = time.monotonic()
        out = []
        for slot in self.slots:
            with slot.lock:
                since = slot.running_since
                out.append({
                    "exporter": slot.name, "explicit": slot.explicit, "available": slot.available,
                    "unavailable_reason": slot.reason, "success": slot.success,
                    "duration_seconds": round(slot.duration, 6), "error": slot.error,
                    "running_seconds": None if since is None else round(now - since, 3),
                    "runs": slot.runs, "failures": slot.failures,
                    "notes": list(self.host.notes.get(slot.name, ())),
                })
        return out
