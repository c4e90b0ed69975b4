"""The correlator inside the agent: a periodic analysis of every live rank (for the
metrics), an on-demand one for ``GET /api/v1/diagnosis``, and the timeline part that
carries each rank's loader settings (the analysis needs num_workers).

Metrics, per rank (at most 5 series with a ``rank`` label, see DESIGN.md's budget):
- ``stallscope_gpu_idle_overlap_ratio``: only when the rank has GPU samples and idle time;
- ``stallscope_stall_period_steps``: always (0 when there is no period or too little data);
- ``stallscope_stall_cause_score{cause}``: the MAX_CAUSE_SERIES best-scoring causes of an
  input-bound rank with a score above zero; absent means "not among the top three" or 0.
  A fixed cap keeps 16,384-rank jobs practical whatever the number of causes evaluated.
"""
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..agent.http import ApiError, one
from ..agent.state import LABELS
from . import diagnosis
from .cache import ArrayCache
from .trace import RankTrace

MAX_CAUSE_SERIES = 3
DEFAULT_INTERVAL = 15.0
DEFAULT_WINDOW = 300.0
GATHERING_S = 2.0   # re-run this often while a rank has no verdict yet


def _seconds(v):
    x = float(v)
    if not 0 < x <= 86400:
        raise ValueError(v)
    return x


class Correlator:
    def __init__(self, agent, window=DEFAULT_WINDOW, interval=DEFAULT_INTERVAL):
        self.agent = agent
        self.window = window
        self.interval = interval
        self.last_run = float("-inf")
        self.cache = ArrayCache()
        self.lock = threading.Lock()
        self.results = []        # [(labels, diagnosis)] from the last scheduled run
        self.runs = 0
        self.failures = 0
        self.last_duration = 0.0

    # -- analysis -------------------------------------------------------------------
    def analyse(self, ranks, seconds, peers_of=None):
        """{rank.key: diagnosis} for ``ranks``; peers are the same job's ranks here."""
        table = self.agent.table
        # Only the scheduled window is cached: other windows would evict it every time.
        cache = self.cache if seconds == self.window else None
        node = RankTrace.scope_from_agent(self.agent, "node", seconds, cache)
        traces = {}
        for r in list(ranks) + list(peers_of if peers_of is not None else ()):
            if r.key not in traces:
                traces[r.key] = RankTrace.from_agent(self.agent, r, seconds, node, cache)
        return {r.key: diagnosis.analyse(traces[r.key], list(traces.values()), node=table.node,
                                         window_seconds=seconds) for r in ranks}

    def tick(self, now=None):
        """The scheduled job (every second): a full run every ``interval`` seconds, and
        sooner (every GATHERING_S) while a live rank has no verdict yet, so a new rank's
        metrics appear within seconds of its first batches, not a whole interval later."""
        now = time.monotonic() if now is None else now
        if now - self.last_run >= self.interval:
            return self.refresh(now)
        if now - self.last_run >= GATHERING_S:
            with self.lock:
                known = {labels: d["verdict"] for labels, d in self.results}
            with self.agent.table.lock:
                gathering = any(known.get(r.labels(), "unknown") == "unknown"
                                for r in self.agent.table.ranks.values())
            if gathering:
                return self.refresh(now)

    def refresh(self, now=None):
        t0 = time.monotonic()
        self.last_run = t0 if now is None else now
        try:
            ranks = self.agent.table.snapshot()
            found = self.analyse(ranks, self.window)
            self.cache.prune()
            with self.agent.table.lock:
                labelled = [(r.labels(), found[r.key]) for r in ranks]
            with self.lock:
                self.results = labelled
                self.runs += 1
        except Exception:
            self.failures += 1
            raise
        finally:
            self.last_duration = time.monotonic() - t0

    # -- metrics --------------------------------------------------------------------
    def describe(self):
        return []

    def collect(self):
        with self.lock:
            results = list(self.results)
            runs, failures, duration = self.runs, self.failures, self.last_duration
        overlap = GaugeMetricFamily(
            "stallscope_gpu_idle_overlap_ratio",
            "Share of the rank's GPU-idle time that overlaps its data-wait (correlator).",
            labels=LABELS)
        period = GaugeMetricFamily(
            "stallscope_stall_period_steps",
            "Dominant period of the rank's data-wait stalls in batches; 0 if none.", labels=LABELS)
        score = GaugeMetricFamily(
            "stallscope_stall_cause_score",
            "Correlator score (0-1) of a candidate stall cause; top %d causes of an "
            "input-bound rank." % MAX_CAUSE_SERIES, labels=LABELS + ("cause",))
        for labels, d in results:
            if d.get("gpu_idle_overlap_ratio") is not None:
                overlap.add_metric(labels, d["gpu_idle_overlap_ratio"])
            period.add_metric(labels, d.get("stall_period_steps") or 0)
            top = [c for c in d.get("causes") or () if c["score"] > 0][:MAX_CAUSE_SERIES]
            for c in top:
                score.add_metric(labels + (c["cause"],), c["score"])
        yield overlap
        yield period
        yield score
        yield CounterMetricFamily("stallscope_correlator_runs", "Scheduled correlator runs.",
                                  value=runs)
        yield CounterMetricFamily("stallscope_correlator_failures", "Failed correlator runs.",
                                  value=failures)
        yield GaugeMetricFamily("stallscope_correlator_duration_seconds",
                                "Duration of the last scheduled correlator run.", value=duration)

    # -- GET /api/v1/diagnosis ------------------------------------------------------
    def route(self, agent, query):
        unknown = set(query) - {"pod", "rank", "job", "namespace", "seconds"}
        if unknown:
            raise ApiError(400, "unknown parameters: %s" % ", ".join(sorted(unknown)))
        if "pod" not in query and "rank" not in query:
            raise ApiError(400, "give pod=POD or rank=RANK (with job= when several jobs run here)")
        seconds = one(query, "seconds", self.window, _seconds)
        match = {}
        if "rank" in query:
            match["rank"] = one(query, "rank", ApiError, int)
        for k in ("pod", "job", "namespace"):
            if k in query:
                match[k] = one(query, k)
        found = agent.table.find(**match)
        if not found:
            raise ApiError(404, "no live rank on node %s matches %s" % (agent.table.node, match))
        if "pod" not in match and len({r.ident["job"] for r in found}) > 1:
            raise ApiError(400, "%d ranks of different jobs match %s: add job= or pod=" % (
                len(found), match))
        jobs = {r.ident["job"] for r in found}
        peers = [r for r in agent.table.snapshot() if r.ident["job"] in jobs]
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


def _severity(d):
    order = {"input_bound": 3, "not_input_bound": 2, "healthy": 1, "unknown": 0}
    return order[d["verdict"]], d.get("data_wait_ratio") or 0.0


def install(agent):
    """Wire the correlator into ``agent``: schedule, metrics, route and timeline part."""
    opts = agent.config.options
    c = Correlator(agent, window=float(opts.get("correlate_window") or DEFAULT_WINDOW),
                   interval=float(opts.get("correlate_interval") or DEFAULT_INTERVAL))
    agent.every(1.0, c.tick)
    agent.registry.register(c)
    agent.add_route("/api/v1/diagnosis", c.route)
    agent.add_timeline_part("loader", lambda rank, seconds: rank.loader)
    return c
