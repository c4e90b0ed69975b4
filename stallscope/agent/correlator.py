"""Part ``correlator``: a periodic analysis of every live rank (for the metrics), an
on-demand one for ``GET /api/v1/diagnosis``, and every second a change-point test on
each rank's data-wait share (correlate/detect.py): a rank found waiting since some
moment is analysed at once on that stall, and again every few seconds while it is
young (less often as it ages: standing.stall_refresh), so a stall is named within
seconds and its causes are ranked on the stall itself, not diluted by the healthy
minutes before it. The analysis itself is pure (stallscope/correlate/); this part
builds its inputs from the host and publishes its outputs.

Metrics, per rank (at most 5 series with a ``rank`` label, within the per-rank budget):
- ``stallscope_gpu_idle_overlap_ratio``: only when the rank has GPU samples and idle time;
- ``stallscope_stall_period_steps``: always (0 when there is no period or too little data);
- ``stallscope_stall_cause_score{cause}``: the MAX_CAUSE_SERIES best-scoring causes of an
  input-bound rank with a score above zero; absent means "not among the top three" or 0.
  A fixed cap keeps 16,384-rank jobs practical whatever the number of causes evaluated.
- ``stallscope_stall_since_timestamp_seconds``: while a stall is detected, when it began
  (Unix time).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any, Callable

from ..correlate import change, detect, diagnosis, standing
from ..correlate.trace import RankTrace, Series
from ..host import ApiError, Part, Query, one
from ..host.contract import no_params
from ..host.families import family
from ..host.options import flag
from .scrapefirst import SCRAPES
from .settingswatch import SettingsWatch

MAX_CAUSE_SERIES = 3
GATHERING_S = 2.0   # re-run this often while a rank has too few batches for a verdict


@dataclasses.dataclass(frozen=True)
class CorrelatorOptions:
    interval: float = flag(15.0, "--correlate.interval",
                           "How often the correlator re-analyses every rank for the metrics.",
                           lo=1, hi=3600, metavar="SECONDS")
    window: float = flag(300.0, "--correlate.window",
                         "How much history each analysis covers (and /api/v1/diagnosis's default).",
                         lo=10, hi=86400, metavar="SECONDS")


def _seconds(v: str) -> float:
    x = float(v)
    if not 0 < x <= 86400:
        raise ValueError(v)
    return x


def no_gpu(_key: Any) -> str | None:
    return None


class CorrelatorPart(Part):
    name = "correlator"
    interval = 1.0

    def __init__(self, host: Any, options: CorrelatorOptions = CorrelatorOptions(),
                 gpu_source_of: Callable[[Any], str | None] = no_gpu,
                 quota_of: Callable[[Any], tuple[float | None, int | None]] | None = None,
                 hang_of: Callable[[Any], dict[str, Any] | None] = lambda _k: None) -> None:
        super().__init__(host)
        self.hang_of = hang_of  # rank key -> the hangs part's latest triage (hangs.py)
        # rank key -> (CFS quota in cores, ranks sharing it), from the cfs exporter; None
        # when it is off (then the quota's absence is not measured)
        self.quota_of = quota_of
        self.window = options.window
        self.every = options.interval
        self.gpu_source_of = gpu_source_of  # rank key -> "nvml", "dcgm", "simulated" or None
        self.last_run = float("-inf")
        self.results: list[Any] = []        # [(labels, diagnosis)] from the last scheduled run
        self.detections: dict[Any, detect.Detection] = {}   # rank key -> the latest test
        self.stalls: dict[Any, Any] = {}    # rank key -> (looked at, since_ns, labels, diagnosis)
        self.bases: dict[Any, tuple[standing.Basis, float]] = {}  # rank key -> (basis, analysed at)
        self.stall_runs = 0                 # stall analyses run (one per due rank)
        self.settings = SettingsWatch(self.lock)  # loader settings' changes (settingswatch.py)
        self.runs = 0
        self.failures = 0
        self.last_duration = 0.0

    # -- inputs ---------------------------------------------------------------------
    def _scope(self, scope: Any, seconds: float) -> dict[str, Series]:
        samples = self.host.samples
        return {sig: Series.from_arrays(*samples.window(scope, sig, seconds))
                for sig in samples.signals(scope)}

    def trace(self, rank: Any, seconds: float, node: dict[str, Series] | None = None) -> RankTrace:
        """The rank's trace from the host: the data the timeline route serves, as the
        arrays the agent keeps (no JSON, no conversion). ``node``: the node-wide
        signals, when several traces share them."""
        if node is None:
            node = self._scope("node", seconds)
        ev = self.host.timeline(rank, seconds, True)  # columns (agent/batches.py)
        return RankTrace.from_columns(dict(rank.ident), rank.loader, ev.t_end, ev.wait, ev.interval, ev.ready,
                                      self._scope(rank.key, seconds), node,
                                      self.gpu_source_of(rank.key), rank.first_batch_ns)

    # -- analysis -------------------------------------------------------------------
    def analyse(self, ranks: list[Any], seconds: float, peers_of: list[Any] | None = None,
                since_of: dict[Any, int] | None = None) -> dict[Any, Any]:
        """{rank.key: diagnosis} for ``ranks``; peers are the same job's ranks here, each
        trace built once for all of them. ``since_of``: rank key -> when its stall began."""
        since_of = since_of or {}
        node = self._scope("node", seconds)
        traces = {}
        for r in list(ranks) + list(peers_of if peers_of is not None else ()):
            if r.key not in traces:
                SCRAPES.pause()
                traces[r.key] = self.trace(r, seconds, node)
        found = {}
        for r in ranks:
            SCRAPES.pause()
            found[r.key] = diagnosis.analyse(traces[r.key], list(traces.values()), node=self.host.node,
                                             window_seconds=seconds, since_ns=since_of.get(r.key),
                                             quota=self.quota(r.key))
        return found

    def quota(self, key: Any) -> dict[str, Any]:
        if self.quota_of is None:
            return {"measured": False, "cores": None, "ranks": None}
        cores, ranks = self.quota_of(key)
        return {"measured": True, "cores": cores, "ranks": ranks}

    # -- stalls, as soon as they are sure -------------------------------------------
    def stall_window(self, since_ns: int, now_ns: int) -> float:
        return standing.stall_window(since_ns, now_ns, self.window)

    def detect(self, now: float) -> None:
        now_ns = time.monotonic_ns()
        ranks = self.host.ranks()
        found = {}
        for r in ranks:
            SCRAPES.pause()
            found[r.key] = detect.judge(*self.host.detection_input(r, now_ns), now_ns)
        self.detections = found
        for key in [k for k in self.stalls if not (found.get(k) and found[k].stalled)]:
            del self.stalls[key]
            self.bases.pop(key, None)
        due: dict[str, list[tuple[Any, int]]] = {}  # job -> [(rank, since_ns)]
        basis_of = {}
        for r in ranks:
            d = found[r.key]
            if not d.stalled or d.since_ns is None:
                continue
            last = self.stalls.get(r.key)
            if last is not None and now - last[0] < standing.stall_refresh(d.since_ns, now_ns, self.every):
                continue
            basis = standing.Basis.of(d.since_ns, d.share, r.loader, self.host.samples.signals(r.key))
            old, analysed = self.bases.get(r.key, (None, now))
            # only a settled stall whose last analysis named causes: a young one's causes
            # are still settling and are ranked every stall_refresh as before (whatever
            # the interval: with --correlate.interval 1 every stall was "old" at once)
            settled = (now_ns - d.since_ns) / 1e9 >= standing.SETTLED_AFTER_S
            if last is not None and settled and last[3].get("causes") \
                    and standing.unchanged(old, basis, now - analysed, now_ns):
                with self.lock:  # a steady stall: its causes stand (standing.py)
                    self.stalls[r.key] = (now,) + tuple(last[1:])
                continue
            basis_of[r.key] = basis
            due.setdefault(r.ident["job"], []).append((r, d.since_ns))
        # One analysis per job for all of its ranks due now: each peer's trace is built
        # once, not once per stalled rank (64 stalled ranks cost 64 x 64 traces before).
        # The window is the widest the job's due stalls need; each rank is still judged
        # on its own stall (since_of), the rest is the quiet time before it.
        for job, stalled in due.items():
            peers = [p for p in ranks if p.ident["job"] == job]
            members = [r for r, _ in stalled]
            window = max(self.stall_window(since, now_ns) for _, since in stalled)
            results = self.analyse(members, window, peers,
                                   since_of={r.key: since for r, since in stalled})
            for r in members:
                result = results[r.key]
                result["detection"] = found[r.key].as_json(now_ns)
                self.bases[r.key] = (basis_of[r.key], now)
                self.stall_runs += 1
                with self.lock:
                    self.stalls[r.key] = (now, found[r.key].since_ns, dict(r.labels), result)

    def tick(self, now: float | None = None) -> None:
        """Every second: a full run every ``interval`` seconds, and sooner (every
        GATHERING_S) while a live rank has no verdict yet, so a new rank's metrics
        appear within seconds of its first batches, not a whole interval later."""
        now = time.monotonic() if now is None else now
        self.detect(now)
        self.watch_settings()
        if now - self.last_run >= self.every:
            return self.refresh(now)
        if now - self.last_run >= GATHERING_S:
            # for batches; a rank starting (rules.py) has a ratio, judged at the interval
            with self.lock:
                known = {tuple(sorted(labels.items())) for labels, d in self.results
                         if d["verdict"] != "unknown" or d.get("data_wait_ratio") is not None}
            if any(tuple(sorted(r.labels.items())) not in known for r in self.host.ranks()):
                return self.refresh(now)
        return None

    def watch_settings(self) -> None:
        self.settings.look(self.host.ranks(), self.current(), lambda key: self.quota(key)["cores"])

    def refresh(self, now: float | None = None) -> None:
        t0 = time.monotonic()
        self.last_run = t0 if now is None else now
        try:
            ranks = self.host.ranks()
            with self.lock:
                stalled = {k: v[3] for k, v in self.stalls.items()}
            # A stalled rank's metrics come from its stall's own analysis (current()),
            # refreshed by detect(): analysing it here too would be thrown away.
            todo = [r for r in ranks if r.key not in stalled]
            found = self.analyse(todo, self.window, peers_of=ranks) if todo else {}
            labelled = [(dict(r.labels), found.get(r.key) or stalled[r.key]) for r in ranks]
            with self.lock:
                self.results = labelled
                self.runs += 1
        except Exception:
            self.failures += 1
            raise
        finally:
            self.last_duration = time.monotonic() - t0

    # -- metrics --------------------------------------------------------------------
    def current(self) -> list[Any]:
        """[(labels, diagnosis)]: a stalled rank's stall analysis, else the scheduled one."""
        with self.lock:
            stalled = {tuple(sorted(s[2].items())): s[2:] for s in self.stalls.values()}
            out = [stalled.pop(tuple(sorted(labels.items())), (labels, d)) for labels, d in self.results]
        return out + list(stalled.values())

    def collect(self) -> Iterator[Any]:
        results = self.current()
        with self.lock:
            runs, failures, duration = self.runs, self.failures, self.last_duration
        overlap = family("stallscope_gpu_idle_overlap_ratio")
        period = family("stallscope_stall_period_steps")
        score = family("stallscope_stall_cause_score")
        since = family("stallscope_stall_since_timestamp_seconds")
        wall = time.time_ns() - time.monotonic_ns()
        for labels, d in results:
            if d.get("since_ns") is not None:
                since.add(labels, (d["since_ns"] + wall) / 1e9)
            if d.get("gpu_idle_overlap_ratio") is not None:
                overlap.add(labels, d["gpu_idle_overlap_ratio"])
            period.add(labels, d.get("stall_period_steps") or 0)
            top = [c for c in d.get("causes") or () if c["score"] > 0][:MAX_CAUSE_SERIES]
            for c in top:
                score.add(labels, c["score"], cause=c["cause"])
        yield from (overlap.family, period.family, score.family, since.family)
        for name, value in (("stallscope_correlator_runs_total", runs),
                            ("stallscope_correlator_failures_total", failures),
                            ("stallscope_correlator_duration_seconds", duration)):
            f = family(name)
            f.add({}, value)
            yield f.family

    def routes(self) -> dict[str, Any]:
        return {"/api/v1/diagnosis": self.route}

    # -- GET /api/v1/diagnosis ------------------------------------------------------
    def route(self, query: Query) -> Any:
        no_params(query, ("pod", "rank", "job", "namespace", "seconds"))
        if "pod" not in query and "rank" not in query:
            raise ApiError(400, "give pod=POD or rank=RANK (with job= when several jobs run here)")
        seconds = one(query, "seconds", None, _seconds)
        match = {}
        if "rank" in query:
            match["rank"] = one(query, "rank", ApiError, int)
        for k in ("pod", "job", "namespace"):
            if k in query:
                match[k] = one(query, k)
        found = self.host.find(**match)
        if not found:
            raise ApiError(404, "no live rank on node %s matches %s" % (self.host.node, match))
        if "pod" not in match and len({r.ident["job"] for r in found}) > 1:
            raise ApiError(400, "%d ranks of different jobs match %s: add job= or pod=" % (
                len(found), match))
        jobs = {r.ident["job"] for r in found}
        peers = [r for r in self.host.ranks() if r.ident["job"] in jobs]
        results = self.analyse(found, seconds or self.window, peers_of=peers)
        now_ns = time.monotonic_ns()
        for r in found:
            d = self.detections.get(r.key, detect.NONE)
            if seconds is None and d.stalled and d.since_ns is not None:  # the stall's own window
                results[r.key] = self.analyse([r], self.stall_window(d.since_ns, now_ns), peers,
                                              since_of={r.key: d.since_ns})[r.key]
            results[r.key]["detection"] = d.as_json(now_ns)
            hang = self.hang_of(r.key)
            if hang is not None:  # the stacks of its blocked next() call (hangs.py)
                results[r.key]["hang"] = hang
            marked = self.settings.changes.get(r.key)
            if marked is not None:
                results[r.key]["change"] = change.view(marked, self.trace(r, seconds or self.window))
        idents = [(r.ident, results[r.key]) for r in found]
        return 200, diagnosis.most_severe(idents)

