"""The report of ``stallscope diagnose`` as typed objects (issue 29), and its one encoder.

Every source is read into these at its edge: the agent's diagnosis by the correlator's
decoder (correlate/codec.py), its ``/api/v1/ranks`` entry and timeline by node.py, the
Prometheus view by cluster.py. The report is assembled from them (report.py) and read by
attribute (verdict.py, story.py, render.py); ``encode`` makes the JSON of
``diagnose --json`` (the contract of docs/diagnose.md), the causes and predictions in it
by the same encoder as the agent's API.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..correlate import codec
from ..correlate.model import Budget, Cause, Change, Diagnosis, GpuView, LoaderError, Prediction, SetupWarning
from ..report import LoaderSettings

JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class JobRank:
    """A rank of the job as a source saw it over the window."""
    rank: Any
    pod: str | None
    node: str | None
    data_wait_ratio: float | None
    data_wait_ratio_after_start: float | None = None
    source: str = ""
    namespace: str | None = None
    job: str | None = None


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The agent's loader sizing (agent/parts/loader.py: sizing), or Prometheus's copy of it."""
    num_workers: int | None = None
    workers_needed: int | None = None
    quota_limited: bool | None = None
    workers_to_keep_up: int | None = None
    workers_cpu_limit: int | None = None
    batch_load_seconds: float | None = None
    compute_seconds: float | None = None
    cfs_quota_cores: float | None = None
    window_seconds: float | None = None
    batches: int | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any] | None) -> Sizing:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (body or {}).items() if k in names})

    @property
    def too_few(self) -> bool:
        return (self.num_workers is not None and self.workers_needed is not None
                and self.workers_needed > self.num_workers)


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """The rank's entry in the agent's /api/v1/ranks."""
    job: str | None
    rank: Any
    pod: str | None
    namespace: str | None
    node: str | None
    pid: int | None = None
    ns_pid: int | None = None
    worker_pids: tuple[int, ...] = ()
    loader: LoaderSettings | None = None
    sizing: Sizing | None = None
    exited: bool = False
    blocked_in_next_seconds: float | None = None
    last_seen_seconds_ago: float | None = None
    batches: int | None = None
    step_seconds_total: float | None = None
    data_wait_seconds_total: float | None = None
    worker_deaths: tuple[Mapping[str, Any], ...] = ()
    hang: Mapping[str, Any] | None = None
    world_size: int | None = None   # as the rank's hook reported it (its job's ranks in all)

    @property
    def wait_share(self) -> float:
        step = self.step_seconds_total or 0.0
        return (self.data_wait_seconds_total or 0.0) / step if step > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Progress:
    """Batches in the window from the rank's timeline: a loop blocked in next() reports
    none until next() returns."""
    batches: int
    batches_total: int | None
    last_batch_age_seconds: float | None
    median_interval_seconds: float | None


@dataclasses.dataclass(frozen=True)
class Since:
    """When the rank's data-wait crossed the line and stayed over it (cluster.since)."""
    above_threshold: bool
    rank: Any
    lookback_seconds: float
    expr: str
    since: float | None = None
    for_seconds: float | None = None
    open_ended: bool = False


@dataclasses.dataclass(frozen=True)
class PodSignal:
    """A cause signal of the pod as Prometheus has it, against its alert's line."""
    signal: str
    cause: str | None
    value: float
    threshold: float | None
    direction: str
    source: str
    expr: str


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """Everything Prometheus knows about the pod's rank and its job (cluster.view)."""
    job: str
    rank: Any
    pod: str
    namespace: str
    node: str
    data_wait_ratio: float | None
    batches: float | None
    pod_ranks: tuple[JobRank, ...]
    job_ranks: int
    job_ranks_with_data: int
    job_max_data_wait_ratio: float | None
    job_median_data_wait_ratio: float | None
    straggler: JobRank | None
    top_ranks: tuple[JobRank, ...]
    ranks_without_batches: tuple[JobRank, ...]
    since: Since | None
    agent_url: str | None
    signals: tuple[PodSignal, ...]
    cause_scores: tuple[tuple[str, float], ...]
    sizing: Sizing
    worker_exits: tuple[tuple[str, int], ...]
    death_causes: tuple[Cause, ...]
    sli_expr: str
    steady_data_wait_ratio: float | None = None   # without iterator starts (promql.py)
    handoff_ratio: float | None = None            # the step's share taking batches over (promql.py)
    # ranks of the job that reported within the silent lookback and not now, their node's
    # agent not scraped (up != 1): what Prometheus cannot see of the job (issue 35)
    dark_ranks: tuple[JobRank, ...] = ()
    dark_agents: tuple[str, ...] = ()
    # (component, cause, share) of the time budget the agent published for the pod
    # (stallscope_stall_budget_ratio), largest first
    budget_shares: tuple[tuple[str, str, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class NodeView:
    """The node detail from the pod's agent (node.view)."""
    url: str
    node: str | None
    rank: RankInfo
    ranks: tuple[RankInfo, ...]
    diagnosis: Diagnosis | None
    timeline: Mapping[str, Any] | None      # /api/v1/timeline, for --plot and the ratio
    progress: Progress | None
    notes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Subject:
    """The rank diagnosed and its job's numbers, from the cluster when it answered, else
    from the agents (report._identity)."""
    job: str | None
    rank: Any
    pod: str | None
    namespace: str | None
    node: str | None
    data_wait_ratio: float | None
    job_max: float | None
    job_median: float | None
    job_scope: str                      # cluster, agents, node
    job_ranks: int
    data_wait_ratio_after_start: float | None = None
    job_rows: tuple[JobRank, ...] | None = None   # the agents' view of the job
    progress: Progress | None = None
    rank_info: RankInfo | None = None
    batches: float | None = None


@dataclasses.dataclass(frozen=True)
class EvidenceRow:
    signal: str
    value: float | None
    threshold: float | None
    direction: str
    status: str                 # over, ok, info, n/a
    source: str
    rank: Any = None
    outside_stalls: float | None = None
    cause: str | None = None


@dataclasses.dataclass(frozen=True)
class NextStep:
    step: str
    runbook: str | None


@dataclasses.dataclass(frozen=True)
class RankHeadroom:
    data_wait_ratio: float | None
    speedup: float | None
    step_seconds: float | None = None
    step_seconds_without_wait: float | None = None


@dataclasses.dataclass(frozen=True)
class JobHeadroom:
    data_wait_ratio: float
    speedup: float | None
    scope: str
    step_seconds_without_wait: float | None = None


@dataclasses.dataclass(frozen=True)
class Cost:
    """Accelerator time idle on input wait now (outlook.py)."""
    world_size: int
    waiting_share: float
    idle_accelerators: float
    gpu_hours_per_day: float
    rank_gpu_hours_per_day: float | None
    scope: str
    cause: str | None


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    url: str
    ok: bool
    node: str | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    verdict: str
    reason: str
    causes: tuple[Cause, ...]
    job: str | None
    rank: Any
    pod: str
    namespace: str | None
    node: str | None
    data_wait_ratio: float | None
    job_max_data_wait_ratio: float | None
    job_median_data_wait_ratio: float | None
    job_scope: str                       # cluster, agents, node
    job_ranks: int
    threshold: float
    straggler: JobRank | None
    top_ranks: tuple[JobRank, ...]
    pod_ranks: tuple[JobRank, ...]
    ranks_without_batches: tuple[JobRank, ...]
    since: Since | None
    window_seconds: float
    generated_at: str
    loader: LoaderSettings | None
    sizing: Sizing
    pids: Mapping[str, Any] | None
    progress: Progress | None
    blocked_in_next_seconds: float | None
    worker_deaths: tuple[Mapping[str, Any], ...]
    worker_exits: tuple[tuple[str, int], ...]
    hang: Mapping[str, Any] | None
    gpu: GpuView | None
    stall_period_steps: int | None
    agent_verdict: str | None
    sli_expr: str | None
    agent_url: str | None
    prometheus_url: str | None
    steady_data_wait_ratio: float | None = None   # without iterator starts, either path
    handoff_ratio: float | None = None            # the step's share taking batches over, either path
    prediction: Prediction | None = None
    rank_headroom: RankHeadroom | None = None
    job_headroom: JobHeadroom | None = None
    cost: Cost | None = None
    change: Change | None = None
    evidence: tuple[EvidenceRow, ...] = ()
    stacks: Mapping[str, Any] | None = None
    plot: str | None = None
    next_steps: tuple[NextStep, ...] = ()
    commands: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()
    warnings: tuple[str, ...] = ()
    elapsed_seconds: float = 0.0
    # set-up checks (issue 32): the agent's warnings, which checks it could not judge,
    # and, where no agent answered, why they are not known
    setup_warnings: tuple[SetupWarning, ...] = ()
    checks_unknown: tuple[str, ...] = ()
    checks_note: str = ""
    # the job had ended: the report is of its last window, ending at its last batch (issue 52)
    ended_at: float | None = None
    loader_error: LoaderError | None = None
    budget: Budget | None = None         # the stall's time budget, from the agent (correlate/budget.py)


def _fields(obj: Any) -> JSON | None:
    return None if obj is None else {k: v for k, v in dataclasses.asdict(obj).items()}


def _row(r: JobRank, full: bool = False) -> JSON:
    out: JSON = {"rank": r.rank, "pod": r.pod, "node": r.node, "data_wait_ratio": r.data_wait_ratio}
    if r.namespace is not None or full:
        out["namespace"] = r.namespace
    if r.job is not None or full:
        out["job"] = r.job
    if r.data_wait_ratio_after_start is not None:
        out["data_wait_ratio_after_start"] = r.data_wait_ratio_after_start
    if r.source:
        out["source"] = r.source
    return out


def _source(s: Source) -> JSON:
    out: JSON = {"name": s.name, "url": s.url, "ok": s.ok}
    if s.node is not None:
        out["node"] = s.node
    if s.error is not None:
        out["error"] = s.error
    return out


def encode(r: Report) -> JSON:
    """The ``diagnose --json`` document."""
    out: JSON = {
        "api": codec.API, "verdict": r.verdict, "reason": r.reason,
        "causes": [codec.cause(c) for c in r.causes],
        "job": r.job, "rank": r.rank, "pod": r.pod, "namespace": r.namespace, "node": r.node,
        "data_wait_ratio": r.data_wait_ratio, "job_max_data_wait_ratio": r.job_max_data_wait_ratio,
        "job_median_data_wait_ratio": r.job_median_data_wait_ratio, "job_scope": r.job_scope,
        "job_ranks": r.job_ranks, "threshold": r.threshold,
        "steady_data_wait_ratio": r.steady_data_wait_ratio,
        "straggler": None if r.straggler is None else {
            "rank": r.straggler.rank, "pod": r.straggler.pod, "node": r.straggler.node,
            "data_wait_ratio": r.straggler.data_wait_ratio},
        "top_ranks": [_row(x) for x in r.top_ranks], "pod_ranks": [_row(x, True) for x in r.pod_ranks],
        "ranks_without_batches": [_row(x, True) for x in r.ranks_without_batches],
        "since": _fields(r.since), "window_seconds": r.window_seconds, "generated_at": r.generated_at,
        "loader": r.loader.to_json() if r.loader is not None else None,
        "sizing": {k: v for k, v in dataclasses.asdict(r.sizing).items() if v is not None},
        "pids": dict(r.pids) if r.pids is not None else None,
        "progress": _fields(r.progress), "blocked_in_next_seconds": r.blocked_in_next_seconds,
        "worker_deaths": [dict(d) for d in r.worker_deaths],
        "worker_exits": [{"reason": reason, "count": n} for reason, n in r.worker_exits],
        "hang": dict(r.hang) if r.hang is not None else None,
        "gpu": _fields(r.gpu), "stall_period_steps": r.stall_period_steps,
        "agent_verdict": r.agent_verdict, "sli_expr": r.sli_expr, "agent_url": r.agent_url,
        "prometheus_url": r.prometheus_url,
        "prediction": codec.prediction(r.prediction) if r.prediction is not None else None,
        "headroom": {"rank": _fields(r.rank_headroom), "job": _fields(r.job_headroom)},
        "cost": _fields(r.cost),
        "evidence": [_evidence(e) for e in r.evidence],
        "stacks": dict(r.stacks) if r.stacks is not None else None,
        "next_steps": [{"step": s.step, "runbook": s.runbook} for s in r.next_steps],
        "commands": list(r.commands), "sources": [_source(s) for s in r.sources],
        "warnings": list(r.warnings), "elapsed_seconds": r.elapsed_seconds,
        "setup_warnings": [_fields(w) for w in r.setup_warnings],
        "checks_unknown": list(r.checks_unknown),
        "loader_error": _fields(r.loader_error),
        "budget": codec.budget(r.budget) if r.budget is not None else None,
    }
    if r.checks_note:
        out["checks_note"] = r.checks_note
    if r.ended_at is not None:
        out["ended_at"] = r.ended_at
    if r.change is not None:
        out["change"] = codec.change(r.change)
    if r.plot is not None:
        out["plot"] = r.plot
    return out


def _evidence(e: EvidenceRow) -> JSON:
    out: JSON = {"signal": e.signal, "value": e.value, "threshold": e.threshold,
                 "direction": e.direction, "status": e.status, "source": e.source}
    for k in ("rank", "outside_stalls", "cause"):
        v = getattr(e, k)
        if v is not None:
            out[k] = v
    return out


def rows(found: Sequence[JobRank]) -> tuple[JobRank, ...]:
    return tuple(found)
