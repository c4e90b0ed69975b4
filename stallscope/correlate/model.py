"""The diagnosis as typed objects: what ``analyse`` returns and every reader takes
(issue 29). No JSON here: the one encoder and its decoder are codec.py, called only at
the edges (the agent's ``/api/v1/diagnosis``, ``stallscope diagnose --json`` and
diagnose reading an agent's answer).

A ``Diagnosis`` holds the rank's ``Verdict`` (rules.py decided it), its loop's numbers
(``Loop``), the GPU's (``GpuView``), the stall period and GPU sawtooth (period.py,
sawtooth.py), its job's ranks on the node, the straggler, the ranked ``Cause``s with
their typed ``Evidence`` and, for the best two, a ``Prediction``; the ``Headroom``. The
agent attaches the change-point ``Detection`` (detect.py), a hang's triage and a marked
change, which come from its other parts as documents of their own.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..report import LoaderSettings
from .detect import Detection
from .period import StallPeriod
from .sawtooth import Sawtooth

# Evidence directions: the value is judged against its threshold this way.
DIRECTIONS = ("above", "below", "equal")


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One row of a cause's evidence: a signal's value during the stalls (and outside
    them where that is measured) against the line it is judged by."""
    signal: str
    during_stalls: float | None
    threshold: float | None = None
    direction: str = "above"
    outside_stalls: float | None = None
    scope: str | None = None            # rank, node, pod
    explained_wait_share: float | None = None
    quiet_time_active_share: float | None = None   # co-occurrence probes only
    samples: int | None = None
    judged_by: str | None = None        # co-occurrence, intensity, level, measured, standing
    worker_pid: int | None = None       # slow_worker: the worker the row is about
    starts: int | None = None           # epoch_start: iterator starts in the window

    @property
    def value(self) -> float | None:
        return self.during_stalls


@dataclasses.dataclass(frozen=True)
class ProposedSettings:
    """The settings a prediction's change sets (None: left as it is): the loader's, the
    CPU limit over it, the pod's /dev/shm, the link's capacity. The codec writes only
    those set, in this order, as the ``settings`` object they always were."""
    cpu_limit_cores: float | None = None
    num_workers: int | None = None
    persistent_workers: bool | None = None
    in_order: bool | None = None
    shm_mib: int | None = None
    link_capacity_bytes_per_second: float | None = None

    def items(self) -> list[tuple[str, Any]]:
        """(name, value) of each setting the change sets, in field order."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None]

    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.items())

    def __bool__(self) -> bool:
        return bool(self.items())


NO_SETTINGS = ProposedSettings()


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What a change will buy (predict.py): the change, its settings, the data-wait
    share and step time to expect, how that was found. ``rules_out``: the settings the
    model says will not help by themselves (more workers on a capped CPU), which no next
    step may then recommend (story.py)."""
    cause: str
    change: str
    settings: ProposedSettings
    predicted_data_wait_ratio: float
    predicted_step_seconds: float
    speedup: float | None
    basis: str
    confidence: str                        # high, medium, low, upper bound
    rules_out: tuple[str, ...] = ()
    cpu_limit_cores: float | None = None
    crowded_ratio: float | None = None
    first_batch_seconds: float | None = None
    removed_share: float | None = None
    cpu_note: str | None = None
    memory_note: str | None = None
    bound_by: str | None = None            # the capacity that binds it (capacity.py)

    @property
    def configured(self) -> bool:
        """A configuration change was modelled (not only the headroom of a fix)."""
        return bool(self.settings)


@dataclasses.dataclass(frozen=True)
class WorkerSpread:
    """slow_worker's look at the rank's workers (slow_worker.analyse)."""
    pid: int
    workers_seen: int
    num_workers: int
    load_seconds: float
    others_load_seconds: float
    spread: float
    consistent: bool
    wait_share: float
    held_share: float
    # the queue's replays: None when no worker stands out (spread at most SPREAD_LOW),
    # where the cause scores 0 whatever they say and they are not run
    replayed_wait_ratio: float | None
    in_order_false_wait_ratio: float | None
    in_order_false_removes: float | None
    removes_measured_share: float | None
    workers: Mapping[int, tuple[float, int, float]]  # pid -> (load s, batches, wait s)


@dataclasses.dataclass(frozen=True)
class Cause:
    """A ranked candidate cause: its score (0-1: how much of the wait it explains, as
    its kind judges that), one sentence, the evidence, and, for the best, a prediction."""
    cause: str
    score: float
    summary: str
    evidence: tuple[Evidence, ...] = ()
    kind: str = "co_occurrence"            # the vocabulary's (Cause.kind)
    prediction: Prediction | None = None
    worker: WorkerSpread | None = None

    def with_score(self, score: float, note: str = "", *more: Evidence) -> Cause:
        return dataclasses.replace(self, score=round(score, 4), summary=self.summary + note,
                                   evidence=self.evidence + more)


@dataclasses.dataclass(frozen=True)
class Headroom:
    """The most any input-side fix can give the rank: its step with no wait."""
    step_seconds: float
    step_seconds_without_wait: float
    data_wait_ratio: float
    speedup: float | None


@dataclasses.dataclass(frozen=True)
class GpuView:
    signal: str | None = None           # gpu_busy_ratio / gpu_sm_active_ratio
    source: str | None = None           # nvml, dcgm, simulated
    samples: int = 0
    idle_ratio: float | None = None
    idle_without_wait_ratio: float | None = None


@dataclasses.dataclass(frozen=True)
class Loop:
    """The loop's own numbers over the window (overlap.InputBound)."""
    data_wait_seconds: float
    steady_data_wait_ratio: float
    iterator_start_wait_seconds: float
    step_seconds: float
    compute_seconds_per_batch: float
    data_wait_ratio_after_start: float | None = None
    handoff_ratio: float | None = None   # transfer.handoff_ratio: the step's share taking batches over


@dataclasses.dataclass(frozen=True)
class RankRow:
    """Another rank of the same job on this node, as the verdict saw it."""
    rank: Any
    pod: str | None
    data_wait_ratio: float | None
    data_wait_ratio_after_start: float | None = None


@dataclasses.dataclass(frozen=True)
class Straggler:
    rank: Any
    pod: str | None
    node: str | None
    data_wait_ratio: float | None
    note: str = ""
    hung: bool = False                  # blocked in next(): no batch, no share in Prometheus


@dataclasses.dataclass(frozen=True)
class Identity:
    job: str | None = None
    rank: Any = None
    pod: str | None = None
    namespace: str | None = None
    node: str | None = None
    world_size: int | None = None

    @classmethod
    def of(cls, ident: Mapping[str, Any], node: str = "") -> Identity:
        world = ident.get("world_size")
        return cls(ident.get("job"), ident.get("rank"), ident.get("pod"), ident.get("namespace"),
                   ident.get("node") or node or None,
                   world if isinstance(world, int) and not isinstance(world, bool) else None)


@dataclasses.dataclass(frozen=True)
class Matched:
    """One of several ranks an API query matched (most_severe)."""
    job: str | None
    rank: Any
    pod: str | None
    verdict: str
    data_wait_ratio: float | None
    top_cause: str | None


@dataclasses.dataclass(frozen=True)
class WatchedSettings:
    """What the agent watches of a rank for a change (correlate/change.py): its loader's
    settings and the CPU quota over it (None: not reported, no quota). The codec writes
    every one, in this order, as the mark's ``from`` and ``to`` objects."""
    num_workers: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None
    cpu_quota_cores: float | None = None

    def items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]


@dataclasses.dataclass(frozen=True)
class Mark:
    """A change of a rank's loader settings (or the CPU quota over it) the agent saw
    (correlate/change.py), with the prediction made before it."""
    at_ns: int
    at_wall: str
    what: str
    before_settings: WatchedSettings
    after_settings: WatchedSettings
    predicted: Prediction | None = None


@dataclasses.dataclass(frozen=True)
class Stats:
    """The steady batches on one side of a change."""
    batches: int
    data_wait_ratio: float
    step_seconds: float


@dataclasses.dataclass(frozen=True)
class Change:
    """A mark with before -> after measured, and how the prediction did."""
    mark: Mark
    before: Stats | None
    after: Stats | None
    stall_gone: bool
    step_error: float | None = None


@dataclasses.dataclass(frozen=True)
class SetupWarning:
    """A set-up check that failed (correlate/checks.py, issue 32): the vocabulary's check,
    the number that makes it wrong (``value`` of ``measure``) against ``line``, the
    sentence and the fix. Not a verdict: it is shown beside one and never pages."""
    check: str
    measure: str
    value: Any
    line: Any
    text: str
    fix: str


@dataclasses.dataclass(frozen=True)
class LoaderError:
    """The loader's own error, as the hook reported it (hook/errors.py, issue 32): the
    exception's type and its bounded, sanitised message, when the agent took it, and the
    cause it names (``shm_exhaustion`` for a failed shared-memory allocation) with the
    /dev/shm size that would have been enough, where it could be computed."""
    type: str
    message: str
    at_ns: int | None = None
    cause: str | None = None
    needed_bytes: int | None = None
    shm_size_bytes: int | None = None
    text: str = ""


# The time budget's components in words (correlate/budget.py names them)
BUDGET_WORDS = {
    "loop.handoff": "the training thread handing batches over",
    "loop.cpu_wait": "the training thread runnable with no CPU",
    "loop.workers_cpu_wait": "the training thread taking batches over from workers the quota throttled",
    "loop.blocked": "the training thread blocked taking batches over (the handoff's IPC)",
    "workers.on_cpu": "the workers on a CPU",
    "workers.cpu_wait": "the workers runnable with no CPU",
    "workers.storage": "the workers blocked reading storage",
    "workers.network": "the workers blocked on the network",
    "workers.sleeping": "the workers in a sleep or a wait of their own code",
    "workers.other": "the workers in other calls",
    "workers.idle": "the workers found idle (a wait the sampler did not place)",
    "loop.unsampled": "the handoff, with the training thread not sampled",
    "unsplit": "waits the hook could not split",
}


@dataclasses.dataclass(frozen=True)
class Component:
    """One measured part of the stall's wait."""
    name: str            # WORDS' key: "<side>.<state>"
    seconds: float       # of the loop's wait it held
    share: float         # of the loop's wait
    cause: str | None    # the mechanism's cause in its context (None: nothing measured names one)
    context: str = ""    # the measured context that named the cause, in words ("" when plain)

    @property
    def words(self) -> str:
        plain = BUDGET_WORDS.get(self.name, self.name)
        return "%s (%s)" % (plain, self.context) if self.context else plain


@dataclasses.dataclass(frozen=True)
class Budget:
    """The stall's wait, accounted. ``components`` sum to the wait (less what the sampler
    did not see, which is ``workers.other``), largest first; ``workers_idle``: the
    workers' share of their time idle, waiting for work, while the loop waited."""
    wait_seconds: float
    ready_seconds: float
    handoff_seconds: float
    components: tuple[Component, ...]
    workers_idle: float | None
    sampled: bool        # the loader-state sampler measured the workers' states

    @property
    def critical(self) -> Component | None:
        """The component that held most of the wait."""
        return self.components[0] if self.components else None

    def share_of(self, cause: str) -> float:
        """The share of the wait held by the mechanisms that ``cause`` names."""
        return float(sum(c.share for c in self.components if c.cause == cause))

    def text(self) -> str:
        """One line: the components over 5 % of the wait."""
        parts = ["%s %.0f%%" % (c.words, 100 * c.share) for c in self.components if c.share >= 0.05]
        return "The wait went to " + (", ".join(parts) or "no component over 5%") + "."


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The node-local diagnosis of one rank (diagnosis.analyse)."""
    who: Identity
    window_seconds: float
    batches: int
    loader: LoaderSettings | None
    verdict: str
    reason: str
    rule: str = ""                         # which rule of rules.py decided
    data_wait_ratio: float | None = None
    job_ranks_on_node: tuple[RankRow, ...] = ()
    straggler: Straggler | None = None
    causes: tuple[Cause, ...] = ()
    not_evaluated: tuple[str, ...] = ()
    loop: Loop | None = None
    gpu: GpuView | None = None
    gpu_idle_overlap_ratio: float | None = None
    stall: StallPeriod | None = None
    sawtooth: Sawtooth | None = None
    since_ns: int | None = None         # judged on a stall that began then
    headroom: Headroom | None = None
    # attached by the agent
    detection: Detection | None = None
    detected_at_ns: int | None = None
    hang: Mapping[str, Any] | None = None     # hangs.py's triage document
    change: Change | None = None             # a marked change, before -> after (change.py)
    matched_ranks: tuple[Matched, ...] = ()
    note: str = ""
    # set-up checks (checks.py): judged at the first batch, whatever the verdict
    warnings: tuple[SetupWarning, ...] = ()
    checks_unknown: tuple[str, ...] = ()
    loader_error: LoaderError | None = None
    budget: Budget | None = None          # the stall's time budget (budget.py)

    @property
    def prediction(self) -> Prediction | None:
        """The top cause's prediction: the report's."""
        return self.causes[0].prediction if self.causes else None

    @property
    def top_cause(self) -> str | None:
        return self.causes[0].cause if self.causes else None

    @property
    def stall_period_steps(self) -> int:
        return self.stall.period_steps if self.stall is not None else 0

    def cause(self, name: str) -> Cause | None:
        return next((c for c in self.causes if c.cause == name), None)
