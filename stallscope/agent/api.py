"""The agent's own JSON API: ``/api/v1/ranks`` and ``/api/v1/timeline``. Each part adds
its fields to a rank's entry (``rank_fields``) and to its timeline (``timeline_fields``);
other routes come from the parts themselves (``routes``).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..host import ApiError, Query, one
from ..host.contract import no_params
from ..system import procfs
from .host import AgentHost, Parts
from .web import healthd

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(stat: list[str]) -> float:
    """utime + stime of a stat_fields() list, in seconds."""
    return round((int(stat[11]) + int(stat[12])) / CLK_TCK, 3)


def _positive(v: str) -> float:
    x = float(v)
    if not 0 < x <= 86400:
        raise ValueError(v)
    return x


class CoreRoutes:
    def __init__(self, host: AgentHost, parts: Parts, budget: Any = None) -> None:
        self.host = host
        self.parts = parts
        self.budget = budget

    def routes(self) -> dict[str, Any]:
        return {"/api/v1/ranks": self.ranks, "/api/v1/timeline": self.timeline,
                "/api/v1/agent": self.agent}

    def agent(self, query: Query) -> tuple[int, Any]:
        """The agent's own cost, all in: CPU seconds of every thread it runs (by name),
        its RSS, and the memory ceiling its options set."""
        no_params(query)
        threads: list[dict[str, Any]] = []
        for t in threading.enumerate():
            stat = procfs.stat_fields("/proc", "self", "task", str(t.native_id))
            if stat is not None:
                threads.append({"name": t.name, "native_id": t.native_id, "cpu_seconds": _cpu_seconds(stat)})
        # the processes it runs, counted in its cost: the health responder (healthd.py)
        cpu, rss = 0.0, 0
        for pid in healthd.running():
            stat = procfs.stat_fields("/proc", str(pid))
            if stat is not None:
                threads.append({"name": "health responder (process)", "native_id": pid,
                                "cpu_seconds": _cpu_seconds(stat)})
                cpu += _cpu_seconds(stat)
                rss += procfs.rss_bytes("/proc", str(pid)) or 0
        threads.sort(key=lambda t: -float(t["cpu_seconds"] or 0))
        self_stat = procfs.stat_fields("/proc", "self")
        own_rss = procfs.rss_bytes("/proc", "self")
        return 200, {"threads": threads,
                     "cpu_seconds": round(_cpu_seconds(self_stat) + cpu, 3) if self_stat else None,
                     "rss_bytes": own_rss + rss if own_rss is not None else None,
                     "memory_ceiling": self.budget.describe() if self.budget is not None else None}

    def ranks(self, query: Query) -> tuple[int, Any]:
        no_params(query, ("job", "pod", "namespace"))
        match = {k: one(query, k) for k in query}
        now = time.monotonic()
        table = self.host.table
        body = []
        for r in table.find(**match):
            with table.lock:
                entry = r.as_json(now)
            entry.update(self.parts.rank_fields(r))
            body.append(entry)
        body.sort(key=lambda r: (r["job"], r["rank"]))
        return 200, {"node": self.host.node, "ranks": body}

    def timeline(self, query: Query) -> tuple[int, Any]:
        no_params(query, ("rank", "job", "pod", "seconds"))
        rank = one(query, "rank", ApiError, int)
        seconds = one(query, "seconds", 60.0, _positive)
        match: dict[str, Any] = {"rank": rank}
        for k in ("job", "pod"):
            if k in query:
                match[k] = one(query, k)
        found = self.host.find(**match)
        if not found:
            raise ApiError(404, "no live rank matches %s" % match)
        if len(found) > 1:
            raise ApiError(400, "%d ranks match %s: add job= or pod=" % (len(found), match))
        r = found[0]
        events = self.host.timeline(r, seconds, True).rows(ready=True)
        # A call still blocked in next() (hook/channel.py blocked_since) is not a batch:
        # its own field, the wait so far (RankTrace.from_timeline puts it back last).
        still = events[-1].tolist() if r.provisional_ns and len(events) else None
        if still is not None:
            events = events[:-1]
        samples = self.host.samples
        body: dict[str, Any] = {
            "rank": r.ident, "seconds": seconds, "clock": "CLOCK_MONOTONIC ns",
            "clock_offset_ns": r.clock_offset_ns,
            "loader": r.loader.to_json() if r.loader is not None else None,
            # the process's first batch (its workers' first start): the verdict's "starting"
            "first_batch_ns": r.first_batch_ns,
            # ready_wait_ns: of the wait, the part spent waiting for a worker's batch to be
            # ready (the rest is transfer); only where the hook split the wait.
            "batches": [{"t_end_ns": e, "wait_ns": w, "interval_ns": i} if r < 0 else
                        {"t_end_ns": e, "wait_ns": w, "interval_ns": i, "ready_wait_ns": r}
                        for e, w, i, r in events.tolist()],
            # Rank-scoped and node-wide signals share names (psi_*): each has its own field.
            "open_wait": (None if still is None else
                          {"t_end_ns": still[0], "wait_ns": still[1], "interval_ns": still[2]}),
            "signals": {sig: [[t, v] for t, v in samples.series(r.key, sig, seconds)]
                        for sig in samples.signals(r.key)},
            "node_signals": {sig: [[t, v] for t, v in samples.series("node", sig, seconds)]
                             for sig in samples.signals("node")},
        }
        body.update(self.parts.timeline_fields(r, seconds))
        return 200, body
