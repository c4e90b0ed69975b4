"""Part ``correlator``: a periodic analysis of every live rank (for the metrics), an
on-demand one for ``GET /api/v1/diagnosis``, and every second a change-point test on
each rank's data-wait share (correlate/detect.py): a rank found waiting since some
moment is analysed at once on that stall, and again every few seconds while it is
young (less often as it ages: rerank.stall_refresh), so a stall is named within
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

Per pod (off the per-rank budget): ``stallscope_stall_budget_ratio{component, cause}``, the
time budget of the pod's most-waiting input-bound rank, its components of BUDGET_MIN_SHARE
or more: the evidence `stallscope diagnose` shows from Prometheus alone (issue 49).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable

from ...cadence import TRAINER_FLUSH_S
from ...correlate import change, checks, codec, detect, diagnosis
from ...correlate.facts import RankFacts
from ...correlate.model import Diagnosis
from ...correlate.queue import Memory
from ...correlate.trace import RankTrace, Series
from ...host import ApiError, Part, Query, one
from ...host.contract import no_params
from ...host.facts import RankCpuset, RankGpu, RankIoLimit, RankMemory, RankQuota, RankShm
from ...host.families import family
from ...host.options import flag
from ..web.http import Made
from ..web.scrapefirst import SCRAPES
from . import rerank
from .settingswatch import SettingsWatch

MAX_CAUSE_SERIES = 3
BUDGET_MIN_SHARE = 0.01
POD_LABELS = ("job", "pod", "namespace", "node")
GATHERING_S = 2.0   # re-run this often while a rank has too few batches for a verdict
# A rank with no news since its last test (no new batch, the same call blocked in next())
# is tested again only this long after it: a steady trainer reports every TRAINER_FLUSH_S
# (2 s; the report cadences, stallscope/cadence.py), so half the tests of a second read the same input,
# and the answer moves with time alone only at the horizon's edge and when a long wait
# that ended grows older than detect.QUIET_BINS (issue 31).
REJUDGE_NS = int(TRAINER_FLUSH_S * 1e9)


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


@dataclasses.dataclass(frozen=True)
class Stall:
    """A rank's stall as the detector dated it, with its latest analysis."""
    looked_at: float                  # monotonic seconds of that analysis
    since_ns: int
    labels: Mapping[str, str]
    diagnosis: Diagnosis


@dataclasses.dataclass(frozen=True)
class Result:
    """A rank's latest scheduled analysis (for the metrics, and /api/v1/diagnosis's answer
    for its window)."""
    labels: Mapping[str, str]
    diagnosis: Diagnosis
    at: float = 0.0  # monotonic seconds of the analysis


# While the API is answering other requests, /api/v1/diagnosis for a rank over the default
# window is answered from the rank's latest analysis (the scheduled one, every --correlate.interval, or its
# stall's) instead of 429 (issue 50: 98-99 % of them at 256 ranks under 50 clients; one
# made for the request waits its turn behind the others). The answer says how old its
# analysis is ("analysis"), and its detection, hang and settings change are at most this
# old.
MADE_FRESH_S = 1.0


class CorrelatorPart(Part):
    name = "correlator"
    interval = 1.0

    def __init__(self, host: Any, options: CorrelatorOptions = CorrelatorOptions(),
                 hang_of: Callable[[Any], dict[str, Any] | None] = lambda _k: None) -> None:
        super().__init__(host)
        self.hang_of = hang_of  # rank key -> the hangs part's latest triage (hangs.py)
        self.window = options.window
        self.every = options.interval
        self.last_run = float("-inf")
        self.results: dict[Any, Result] = {}    # rank key -> the last scheduled run's
        self.detections: dict[Any, detect.Detection] = {}   # rank key -> the latest test
        # rank key -> (its detection_news, when tested, the test): see REJUDGE_NS
        self.judged: dict[Any, tuple[Any, int, detect.Detection]] = {}
        self.stalls: dict[Any, Stall] = {}      # rank key -> its stall, while it stalls
        self.bases: dict[Any, tuple[rerank.Basis, float]] = {}  # rank key -> (basis, analysed at)
        self.stall_runs = 0                 # stall analyses run (one per due rank)
        self.analyses = 0                   # diagnosis.analyse calls, every purpose
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
        gpu = self.host.facts.value(RankGpu, rank.key)  # the gpu exporter's, when it runs
        ev = self.host.timeline(rank, seconds, True)  # columns (agent/table/batches.py)
        end = self.host.open_wait_end(rank)
        open_ns = end if end is not None and len(ev) and int(ev.t_end[-1]) == end else None
        return RankTrace.from_columns(dict(rank.ident), rank.loader, ev.t_end, ev.wait, ev.interval, ev.ready,
                                      self._scope(rank.key, seconds), node,
                                      gpu.source if gpu is not None else None, rank.first_batch_ns, open_ns)

    # -- analysis -------------------------------------------------------------------
    def analyse(self, ranks: list[Any], seconds: float, peers_of: list[Any] | None = None,
                since_of: dict[Any, int] | None = None) -> dict[Any, Diagnosis]:
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
                                             facts=self.facts(r))
            self.analyses += 1
        return found

    def setup(self, rank: Any) -> checks.SetUp:
        """What the rank's set-up checks are judged on (correlate/checks.py, issue 32): the
        host's facts about it; absent facts are "not known", never "fine"."""
        facts, key = self.host.facts, rank.key
        gpu = facts.value(RankGpu, key)
        quota = facts.value(RankQuota, key)
        shm = facts.value(RankShm, key)
        cpuset = facts.value(RankCpuset, key)
        wants_pinned = True if gpu is not None else (
            cpuset.qos == "guaranteed" if cpuset is not None and cpuset.qos else None)
        return checks.SetUp(None, gpu=True if gpu is not None else None,
                            cpu_limit_cores=quota.cores if quota is not None else None,
                            quota_measured=quota is not None,
                            shm_size_bytes=shm.size_bytes if shm is not None else None,
                            wants_pinned=wants_pinned)

    def facts(self, rank: Any) -> RankFacts:
        """What the host's exporters know of the rank, as the analysis takes it
        (correlate/facts.py): the cfs exporter's quota (not measured while it has not
        collected the rank), the cpuset's CPUs, the memory limit, the set-up, the loader's
        error."""
        key = rank.key
        q = self.host.facts.value(RankQuota, key)
        cpuset = self.host.facts.value(RankCpuset, key)
        io = self.host.facts.value(RankIoLimit, key)
        return RankFacts(quota_measured=q is not None, quota_cores=q.cores if q is not None else None,
                         quota_ranks=q.ranks if q is not None else None,
                         # the CPUs the rank may run on: its workers' cores capacity (capacity.py)
                         cpus=cpuset.cpus if cpuset is not None and cpuset.cpus > 0 else None,
                         io_read_limit=io.read_bytes_per_second if io is not None else None,
                         memory=self.memory(key), setup=self.setup(rank),
                         loader_error=getattr(rank, "loader_error", None))

    def quota_cores(self, key: Any) -> float | None:
        """The cfs exporter's quota over the rank's loader, in cores (None: none, or not yet)."""
        q = self.host.facts.value(RankQuota, key)
        return q.cores if q is not None else None

    def memory(self, key: Any) -> Memory | None:
        """The workers exporter's RankMemory fact as the correlator's model takes it."""
        m = self.host.facts.value(RankMemory, key)
        return None if m is None else Memory(m.limit_bytes, m.used_bytes, m.worker_rss_bytes)

    # -- stalls, as soon as they are sure -------------------------------------------
    def stall_window(self, since_ns: int, now_ns: int) -> float:
        return rerank.stall_window(since_ns, now_ns, self.window)

    def detect(self, now: float) -> None:
        now_ns = time.monotonic_ns()
        ranks = self.host.ranks()
        found, judged = {}, {}
        for r in ranks:
            news = self.host.detection_news(r)
            held = self.judged.get(r.key)
            if held is not None and held[0] == news and now_ns - held[1] < REJUDGE_NS:
                found[r.key], judged[r.key] = held[2], held
                continue
            SCRAPES.pause()
            found[r.key] = detect.judge(*self.host.detection_input(r, now_ns), now_ns)
            judged[r.key] = (news, now_ns, found[r.key])
        self.detections, self.judged = found, judged
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
            refresh = rerank.stall_refresh(d.since_ns, now_ns, self.every)
            if last is not None and now - last.looked_at < refresh:
                continue
            basis = rerank.Basis.of(d.since_ns, d.share, r.loader, self.host.samples.signals(r.key))
            old, analysed = self.bases.get(r.key, (None, now))
            # only a settled stall whose last analysis named causes: a young one's causes
            # are still settling and are ranked every stall_refresh as before (whatever
            # the interval: with --correlate.interval 1 every stall was "old" at once)
            settled = (now_ns - d.since_ns) / 1e9 >= rerank.SETTLED_AFTER_S
            if last is not None and settled and last.diagnosis.causes \
                    and rerank.unchanged(old, basis, now - analysed, now_ns):
                with self.lock:  # a steady stall: its causes stand (standing.py)
                    self.stalls[r.key] = dataclasses.replace(last, looked_at=now)
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
            since_of = {r.key: since for r, since in stalled}
            results = self.analyse(members, window, peers, since_of=since_of)
            for r in members:
                result = dataclasses.replace(results[r.key], detection=found[r.key], detected_at_ns=now_ns)
                self.bases[r.key] = (basis_of[r.key], now)
                self.stall_runs += 1
                with self.lock:
                    self.stalls[r.key] = Stall(now, since_of[r.key], dict(r.labels), result)

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
                known = {k for k, res in self.results.items()
                         if res.diagnosis.verdict != "unknown" or res.diagnosis.data_wait_ratio is not None}
            if any(r.key not in known for r in self.host.ranks()):
                return self.refresh(now)
        return None

    def watch_settings(self) -> None:
        self.settings.look(self.host.ranks(), self.current(), self.quota_cores)

    def refresh(self, now: float | None = None) -> None:
        t0 = time.monotonic()
        self.last_run = t0 if now is None else now
        try:
            ranks = self.host.ranks()
            with self.lock:
                stalled = {k: v.diagnosis for k, v in self.stalls.items()}
            # A stalled rank's metrics come from its stall's own analysis (current()),
            # refreshed by detect(): analysing it here too would be thrown away.
            todo = [r for r in ranks if r.key not in stalled]
            found = self.analyse(todo, self.window, peers_of=ranks) if todo else {}
            done = time.monotonic()
            results = {r.key: Result(dict(r.labels), found[r.key], done) for r in ranks if r.key in found}
            with self.lock:
                results.update((k, Result(s.labels, s.diagnosis, s.looked_at))
                               for k, s in self.stalls.items() if k in stalled)
            with self.lock:
                self.results = results
                self.runs += 1
        except Exception:
            self.failures += 1
            raise
        finally:
            self.last_duration = time.monotonic() - t0

    # -- metrics --------------------------------------------------------------------
    def current(self) -> list[tuple[Mapping[str, str], Diagnosis]]:
        """[(labels, diagnosis)]: a stalled rank's stall analysis, else the scheduled one."""
        with self.lock:
            found = {k: (r.labels, r.diagnosis) for k, r in self.results.items()}
            found.update((k, (s.labels, s.diagnosis)) for k, s in self.stalls.items())
        return list(found.values())

    def collect(self) -> Iterator[Any]:
        results = self.current()
        with self.lock:
            runs, failures, duration = self.runs, self.failures, self.last_duration
        overlap = family("stallscope_gpu_idle_overlap_ratio")
        period = family("stallscope_stall_period_steps")
        score = family("stallscope_stall_cause_score")
        since = family("stallscope_stall_since_timestamp_seconds")
        spent = family("stallscope_stall_budget_ratio")
        wall = time.time_ns() - time.monotonic_ns()
        worst: dict[tuple[str, ...], tuple[float, Diagnosis]] = {}
        for labels, d in results:
            if d.verdict == "input_bound" and d.budget is not None:
                pod = tuple(str(labels.get(k, "")) for k in POD_LABELS)
                if pod not in worst or (d.data_wait_ratio or 0.0) > worst[pod][0]:
                    worst[pod] = (d.data_wait_ratio or 0.0, d)
        for pod in sorted(worst):
            b = worst[pod][1].budget
            for part in b.components if b is not None else ():
                if part.share >= BUDGET_MIN_SHARE:
                    spent.add(dict(zip(POD_LABELS, pod)), part.share, component=part.name,
                              cause=part.cause or "")
        for labels, d in results:
            if d.since_ns is not None:
                since.add(labels, (d.since_ns + wall) / 1e9)
            if d.gpu_idle_overlap_ratio is not None:
                overlap.add(labels, d.gpu_idle_overlap_ratio)
            period.add(labels, d.stall_period_steps)
            for c in [c for c in d.causes if c.score > 0][:MAX_CAUSE_SERIES]:
                score.add(labels, c.score, cause=c.cause)
        yield from (overlap.family, period.family, score.family, since.family, spent.family)
        for name, value in (("stallscope_correlator_runs_total", runs),
                            ("stallscope_correlator_failures_total", failures),
                            ("stallscope_correlator_duration_seconds", duration)):
            f = family(name)
            f.add({}, value)
            yield f.family

    def routes(self) -> dict[str, Any]:
        return {"/api/v1/diagnosis": Made(self.route, self.made)}

    # -- GET /api/v1/diagnosis ------------------------------------------------------
    def _match(self, query: Query) -> dict[str, Any]:
        no_params(query, ("pod", "rank", "job", "namespace", "seconds"))
        if "pod" not in query and "rank" not in query:
            raise ApiError(400, "give pod=POD or rank=RANK (with job= when several jobs run here)")
        match = {}
        if "rank" in query:
            match["rank"] = one(query, "rank", ApiError, int)
        for k in ("pod", "job", "namespace"):
            if k in query:
                match[k] = one(query, k)
        return match

    def made(self, query: Query) -> tuple[Any, Callable[[], tuple[int, Any]]] | None:
        """The answer for one rank over the default window from its latest analysis
        (http.Made): None when the request asks for another window, matches other than
        one rank, or the rank has not been analysed yet (the route analyses then)."""
        if "seconds" in query:
            return None
        found = self.host.find(**self._match(query))
        if len(found) != 1:
            return None
        r = found[0]
        with self.lock:
            stall, result = self.stalls.get(r.key), self.results.get(r.key)
        if stall is not None:
            d, at, made = stall.diagnosis, stall.looked_at, "stall"
        elif result is not None:
            d, at, made = result.diagnosis, result.at, "scheduled"
        else:
            return None
        now = time.monotonic()

        def build() -> tuple[int, Any]:
            now_ns = time.monotonic_ns()
            marked = self.settings.changes.get(r.key)
            window = d.window_seconds or self.window
            full = dataclasses.replace(
                d, detection=self.detections.get(r.key, detect.NONE), detected_at_ns=now_ns,
                hang=self.hang_of(r.key),
                change=change.view(marked, self.trace(r, window)) if marked is not None else None)
            body = codec.encode(full, now_ns)
            body["analysis"] = {"made": made, "seconds_ago": round(time.monotonic() - at, 3)}
            return 200, body
        # the same analysis, re-encoded at most every MADE_FRESH_S (detection, hang)
        return (id(d), r.key, int(now / MADE_FRESH_S)), build

    def route(self, query: Query) -> Any:
        match = self._match(query)
        seconds = one(query, "seconds", None, _seconds)
        found = self.host.find(**match)
        if not found:
            raise ApiError(404, "no live rank on node %s matches %s" % (self.host.node, match))
        if "pod" not in match and len({r.ident["job"] for r in found}) > 1:
            raise ApiError(400, "%d ranks of different jobs match %s: add job= or pod=" % (
                len(found), match))
        jobs = {r.ident["job"] for r in found}
        peers = [r for r in self.host.ranks() if r.ident["job"] in jobs]
        now_ns = time.monotonic_ns()
        detections = {r.key: self.detections.get(r.key, detect.NONE) for r in found}
        # a stalled rank is judged on its stall's own window, once; the others on the window
        stalled = {r.key: d.since_ns for r in found for d in [detections[r.key]]
                   if seconds is None and d.stalled and d.since_ns is not None}
        results = {}
        plain = [r for r in found if r.key not in stalled]
        if plain:
            results.update(self.analyse(plain, seconds or self.window, peers_of=peers))
        for r in found:
            if r.key in stalled:
                results.update(self.analyse([r], self.stall_window(stalled[r.key], now_ns), peers,
                                            since_of={r.key: stalled[r.key]}))
        for r in found:
            marked = self.settings.changes.get(r.key)
            results[r.key] = dataclasses.replace(
                results[r.key], detection=detections[r.key], detected_at_ns=now_ns,
                hang=self.hang_of(r.key),  # the stacks of its blocked next() call (hangs.py)
                change=change.view(marked, self.trace(r, seconds or self.window))
                if marked is not None else None)
        idents = [(r.ident, results[r.key]) for r in found]
        body = codec.encode(diagnosis.most_severe(idents), now_ns)
        body["analysis"] = {"made": "request", "seconds_ago": 0.0}
        return 200, body

