"""Part ``ranks``: the hook-fed core's series (per-rank data-wait and step histograms,
loader config, dropped events) and the ingest's self-health.

``collect()`` builds fresh families from a snapshot on every scrape (client_python's
custom-collector pattern), so an expired rank's series simply stop being exported.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ... import __version__
from ...correlate import loader_errors
from ...host import Part
from ...host.families import family
from ...vocabulary.agent import DEPARTED_PODS_KEPT
from ...vocabulary.labels import LOADER_CONFIG
from ..table.ingest import IngestStats
from ..table.state import RankTable

ERROR_POD = ("job", "pod", "namespace", "node")
ERROR_CAUSES = (loader_errors.SHM, "other")
ERRORS_KEPT_S = 900.0  # as the worker exits are (exporters/worker_deaths.py)
# A departed pod keeps its counters only when one of them counted an error, and at most
# this many departed pods do (the most recently seen), as the worker exits' do: every
# pod's counters at 0 for 900 s left 20,000 series after 10,000 pods churned (issue 50).


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class RanksPart(Part):
    name = "ranks"

    def __init__(self, host: Any, table: RankTable, stats: IngestStats, held: Any = (),
                 pods: Any = None) -> None:
        super().__init__(host)
        self.pods = pods  # kubepods.PodMap: whether pod names are checked against the API
        self.table = table
        self.stats = stats
        self.held = held
        # the loader errors counted, per pod: (namespace, pod, job, node) -> ({cause: n},
        # last seen), and the processes already counted (rank key, PID)
        self.errors: dict[tuple[str, ...], tuple[dict[str, int], float]] = {}
        self.counted: set[tuple[Any, int | None]] = set()

    def _count_errors(self, ranks: list[Any], now: float) -> None:
        """Each process's loader error once, by the cause its message names (issue 32)."""
        live = set()
        for r in ranks:
            pod = tuple(r.labels[k] for k in ERROR_POD)
            counts = self.errors.get(pod, ({c: 0 for c in ERROR_CAUSES}, now))[0]
            self.errors[pod] = (counts, now)
            key = (r.key, r.pid)
            live.add(key)
            if r.loader_error is not None and key not in self.counted:
                cause = loader_errors.judge(r.loader_error, r.loader).cause
                counts[cause if cause in ERROR_CAUSES else "other"] += 1
                self.counted.add(key)
        self.counted &= live
        # Live pods keep theirs from 0 (increase() sees the first error); a departed pod
        # only when it counted one, for ERRORS_KEPT_S, the newest DEPARTED_PODS_KEPT.
        alive = {tuple(r.labels[k] for k in ERROR_POD) for r in ranks}
        departed = [(seen, pod) for pod, (counts, seen) in self.errors.items() if pod not in alive]
        kept = sorted((seen, pod) for seen, pod in departed
                      if now - seen <= ERRORS_KEPT_S and any(self.errors[pod][0].values()))
        for _seen, pod in set(departed) - set(kept[-DEPARTED_PODS_KEPT:]):
            del self.errors[pod]

    def collect(self) -> Iterator[Any]:
        wait = family("stallscope_data_wait_seconds")
        step = family("stallscope_step_seconds")
        info = family("stallscope_loader_info")
        dropped = family("stallscope_hook_dropped_events_total")
        steady_wait = family("stallscope_steady_data_wait_seconds_total")
        errors = family("stallscope_loader_errors_total")
        with self.table.lock:
            ranks = list(self.table.ranks.values())
            self._count_errors(ranks, time.monotonic())
            for r in ranks:
                wait.add_histogram(r.labels, r.wait.cumulative(), r.wait.sum_ns / 1e9)
                step.add_histogram(r.labels, r.step.cumulative(), r.step.sum_ns / 1e9)
                if r.loader is not None:
                    info.add(r.labels, 1, **{k: _str(getattr(r.loader, k)) for k in LOADER_CONFIG})
                dropped.add(r.labels, r.dropped_total)
                steady_wait.add(r.labels, r.steady_wait_ns / 1e9)
            evictions = dict(self.table.evictions)
        for pod, (counts, _) in sorted(self.errors.items()):
            for cause, n in counts.items():
                errors.add(dict(zip(ERROR_POD, pod)), n, cause=cause)
        for f in (wait, step, info, dropped, steady_wait, errors):
            yield f.family
        yield from self._self_health(len(ranks), evictions)

    def _self_health(self, n_ranks: int, evictions: dict) -> Iterator[Any]:  # type: ignore[type-arg]
        s = self.stats
        for name, value in (("stallscope_agent_messages_total", s.accepted),
                            ("stallscope_agent_events_total", s.events),
                            ("stallscope_agent_ranks", n_ranks),
                            ("stallscope_agent_max_ranks", self.table.max_ranks),
                            ("stallscope_agent_connections", s.connections),
                            ("stallscope_agent_held_messages", len(self.held)),
                            ("stallscope_agent_pod_identity_up",
                             int(self.pods is not None and self.pods.current)),
                            ("stallscope_agent_socket_recreated_total", s.socket_recreated),
                            ("stallscope_agent_refused_worker_pids_total", self.table.refused_worker_pids),
                            ("stallscope_agent_name_bindings", len(self.table.names)),
                            ("stallscope_agent_name_bindings_evicted_total", self.table.names.evicted),
                            ("stallscope_agent_name_bindings_released_total", self.table.names.released),
                            ("stallscope_agent_allowlist_reload_failures_total",
                             self.table.names.allow.reload_failures)):
            f = family(name)
            f.add({}, value)
            yield f.family
        rej = family("stallscope_agent_rejected_messages_total")
        for reason, n in sorted(dict(s.rejected).items()):
            rej.add({}, n, reason=reason)
        yield rej.family
        closed = family("stallscope_agent_connections_closed_total")
        for reason in ("idle",):
            closed.add({}, s.closed.get(reason, 0), reason=reason)
        yield closed.family
        ev = family("stallscope_agent_rank_evictions_total")
        for reason in ("exited", "silent"):
            ev.add({}, evictions.get(reason, 0), reason=reason)
        yield ev.family
        b = family("stallscope_agent_build_info")
        b.add({"node": self.table.node}, 1, version=__version__)
        yield b.family
