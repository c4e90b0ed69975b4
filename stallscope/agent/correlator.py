"""Part ``correlator``: a periodic analysis of every live rank (for the metrics), an
on-demand one for ``GET /api/v1/diagnosis``. The analysis itself is pure
(stallscope/correlate/); this part builds its inputs from the host and publishes its
outputs.

Metrics, per rank (at most 5 series with a ``rank`` label, within the per-rank budget):
- ``stallscope_gpu_idle_overlap_ratio``: only when the rank has GPU samples and idle time;
- ``stallscope_stall_period_steps``: always (0 when there is no period or too little data);
- ``stallscope_stall_cause_score{cause}``: the MAX_CAUSE_SERIES best-scoring causes of an
  input-bound rank with a score above zero; absent means "not among the top three" or 0.
  A fixed cap keeps 16,384-rank jobs practical whatever the number of causes evaluated.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from ..correlate import diagnosis
from ..correlate.trace import RankTrace, Series, events_array, points_array
from ..host import ApiError, Part, Query, one
from ..host.contract import no_params
from ..host.families import family
from ..host.options import flag
from .arrays import ArrayCache

MAX_CAUSE_SERIES = 3
GATHERING_S = 2.0   # re-run this often while a rank has no verdict yet


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


def no_gpu(_key: Any) -> Optional[str]:
    return None


class CorrelatorPart(Part):
    name = "correlator"
    interval = 1.0

    def __init__(self, host: Any, options: CorrelatorOptions = CorrelatorOptions(),
                 gpu_source_of: Callable[[Any], Optional[str]] = no_gpu) -> None:
        super().__init__(host)
        self.window = options.window
        self.every = options.interval
        self.gpu_source_of = gpu_source_of  # rank key -> "nvml", "dcgm", "simulated" or None
        self.last_run = float("-inf")
        self.cache = ArrayCache()
        self.results: List[Any] = []        # [(labels, diagnosis)] from the last scheduled run
        self.runs = 0
        self.failures = 0
        self.last_duration = 0.0

    # -- inputs ---------------------------------------------------------------------
    def _scope(self, scope: Any, seconds: float, cache: Optional[ArrayCache]) -> Dict[str, Series]:
        samples = self.host.samples
        out = {}
        for sig in samples.signals(scope):
            points = samples.series(scope, sig, seconds)
            arr = cache.array((scope, sig), points, points_array) if cache else points_array(points)
            out[sig] = Series.from_array(arr)
        return out

    def trace(self, rank: Any, seconds: float, node: Optional[Dict[str, Series]] = None,
              cache: Optional[ArrayCache] = None) -> RankTrace:
        """The rank's trace from the host: the data the timeline route serves, without
        JSON; with an ArrayCache only what is new since the last call is converted.
        ``node``: the node-wide signals, when several traces share them."""
        if node is None:
            node = self._scope("node", seconds, cache)
        events: Any = self.host.timeline(rank, seconds)
        if cache is not None:
            events = cache.array((rank.key, "events"), events, events_array)
        return RankTrace.from_events(dict(rank.ident), rank.loader, events,
                                     self._scope(rank.key, seconds, cache), node,
                                     self.gpu_source_of(rank.key))

    # -- analysis -------------------------------------------------------------------
    def analyse(self, ranks: List[Any], seconds: float, peers_of: Optional[List[Any]] = None) -> Dict[Any, Any]:
        """{rank.key: diagnosis} for ``ranks``; peers are the same job's ranks here."""
        # Only the scheduled window is cached: other windows would evict it every time.
        cache = self.cache if seconds == self.window else None
        node = self._scope("node", seconds, cache)
        traces = {}
        for r in list(ranks) + list(peers_of if peers_of is not None else ()):
            if r.key not in traces:
                traces[r.key] = self.trace(r, seconds, node, cache)
        return {r.key: diagnosis.analyse(traces[r.key], list(traces.values()), node=self.host.node,
                                         window_seconds=seconds) for r in ranks}

    def tick(self, now: Optional[float] = None) -> None:
        """Every second: a full run every ``interval`` seconds, and sooner (every
        GATHERING_S) while a live rank has no verdict yet, so a new rank's metrics
        appear within seconds of its first batches, not a whole interval later."""
        now = time.monotonic() if now is None else now
        if now - self.last_run >= self.every:
            return self.refresh(now)
        if now - self.last_run >= GATHERING_S:
            with self.lock:
                known = {tuple(sorted(labels.items())): d["verdict"] for labels, d in self.results}
            if any(known.get(tuple(sorted(r.labels.items())), "unknown") == "unknown"
                   for r in self.host.ranks()):
                return self.refresh(now)
        return None

    def refresh(self, now: Optional[float] = None) -> None:
        t0 = time.monotonic()
        self.last_run = t0 if now is None else now
        try:
            ranks = self.host.ranks()
            found = self.analyse(ranks, self.window)
            self.cache.prune()
            labelled = [(dict(r.labels), found[r.key]) for r in ranks]
            with self.lock:
                self.results = labelled
                self.runs += 1
        except Exception:
            self.failures += 1
            raise
        finally:
            self.last_duration = time.monotonic() - t0

    # -- metrics --------------------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        with self.lock:
            results = list(self.results)
            runs, failures, duration = self.runs, self.failures, self.last_duration
        overlap = family("stallscope_gpu_idle_overlap_ratio")
        period = family("stallscope_stall_period_steps")
        score = family("stallscope_stall_cause_score")
        for labels, d in results:
            if d.get("gpu_idle_overlap_ratio") is not None:
                overlap.add(labels, d["gpu_idle_overlap_ratio"])
            period.add(labels, d.get("stall_period_steps") or 0)
            top = [c for c in d.get("causes") or () if c["score"] > 0][:MAX_CAUSE_SERIES]
            for c in top:
                score.add(labels, c["score"], cause=c["cause"])
        yield from (overlap.family, period.family, score.family)
        for name, value in (("stallscope_correlator_runs_total", runs),
                            ("stallscope_correlator_failures_total", failures),
                            ("stallscope_correlator_duration_seconds", duration)):
            f = family(name)
            f.add({}, value)
            yield f.family

    def routes(self) -> Dict[str, Any]:
        return {"/api/v1/diagnosis": self.route}

    # -- GET /api/v1/diagnosis ------------------------------------------------------
    def route(self, query: Query) -> Any:
        no_params(query, ("pod", "rank", "job", "namespace", "seconds"))
        if "pod" not in query and "rank" not in query:
            raise ApiError(400, "give pod=POD or rank=RANK (with job= when several jobs run here)")
        seconds = one(query, "seconds", self.window, _seconds)
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
        results = self.analyse(found, seconds, peers_of=peers)
        chosen = max(found, key=lambda r: _severity(results[r.key]))
        body = dict(results[chosen.key])
        if len(found) > 1:
            body["matched_ranks"] = sorted(
                [{"job": r.ident["job"], "rank": r.ident["rank"], "pod": r.ident["pod"],
                  "verdict": results[r.key]["verdict"],
                  "data_wait_ratio": results[r.key]["data_wait_ratio"],
                  "top_cause": diagnosis.top_cause(results[r.key])} for r in found],
                key=lambda d: (d["job"], d["rank"]))
            body["note"] = ("%d ranks match; this is the one that waits most on its loader, "
                            "see matched_ranks for the others." % len(found))
        return 200, body


def _severity(d: Dict[str, Any]) -> Any:
    order = {"input_bound": 3, "not_input_bound": 2, "healthy": 1, "unknown": 0}
    return order[d["verdict"]], d.get("data_wait_ratio") or 0.0
