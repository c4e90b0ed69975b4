"""An accepted hook report as every part receives it (``Part.handle``): typed where it
enters, by the agent's validation (agent/table/validate.py ``parse``), and read by its
fields from there on, never by a dict's keys. The wire format is the hook's
(hook/wire.py); nothing here changes it.

Here, in the part contract, because the parts outside the agent (the exporters, the GPU)
read the report too and may import the host, never the agent; the batch columns it
carries live here for the same reason (the agent's timeline keeps them:
agent/table/batches.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..report import LoaderSettings

RankKey = tuple[str, str, str, int]   # (namespace, pod, job, rank)


@dataclasses.dataclass(frozen=True)
class BatchColumns:
    """Batch events, one element per batch in each 1-D int64 column (ns): the loop was
    blocked in ``next()`` during ``[t_end - wait, t_end]``, ``interval`` is the time since
    the previous batch's ``t_end``. ``ready``: of each wait, the part spent waiting for a
    worker's batch to be ready (-1 where the hook did not split it); None when no event
    of the report carries one."""
    t_end: np.ndarray
    wait: np.ndarray
    interval: np.ndarray
    ready: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.t_end)

    @property
    def nbytes(self) -> int:
        """What the columns hold (a held report counts it: agent/table/held.py)."""
        return int(self.t_end.nbytes + self.wait.nbytes + self.interval.nbytes
                   + (self.ready.nbytes if self.ready is not None else 0))

    @classmethod
    def empty(cls) -> BatchColumns:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, None)

    @classmethod
    def of(cls, events: Any) -> BatchColumns:
        """``events`` as columns: as they are when they are (every validated message's),
        else from rows of (t_end, wait, interval[, ready]) (a message built in code: the
        tests', the benchmarks')."""
        if isinstance(events, BatchColumns):
            return events
        rows = np.asarray(events, np.int64)
        if not rows.size:
            return cls.empty()
        rows = rows.reshape(len(rows), -1)
        return cls(rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(),
                   rows[:, 3].copy() if rows.shape[1] > 3 else None)

    def rows(self, ready: bool = False) -> np.ndarray:
        """(n, 3) rows of (t_end, wait, interval), or (n, 4) with the ready wait (-1 where
        not split), for a reader that wants rows."""
        cols = (self.t_end, self.wait, self.interval) + ((self.ready_or_unsplit(),) if ready else ())
        return np.stack(cols, axis=1)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # What np.asarray makes of the events: their (n, 3) rows. The simulated GPU
        # (exporters/gpu/sim.py) keeps rows; it runs in the lab and tests only.
        rows = self.rows()
        return rows if dtype is None else rows.astype(dtype)

    def ready_or_unsplit(self) -> np.ndarray:
        """The ready column, -1 throughout where the hook did not split the waits."""
        return self.ready if self.ready is not None else np.full(len(self), -1, np.int64)


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who the report says it speaks for (its own word: identity/admission.py judges it).
    ``node`` and, without a pod map, ``namespace`` and ``pod`` may be empty."""
    job: str
    rank: int
    local_rank: int = 0
    world_size: int = 1
    pod: str = ""
    namespace: str = ""
    node: str = ""

    @property
    def key(self) -> RankKey:
        return (self.namespace, self.pod, self.job, self.rank)

    def as_dict(self) -> dict[str, Any]:
        """The fields in the order the API has always written them (a rank's ``ident``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StepPhases:
    """A trainer's step phases since it started (hook/phases.py): cumulative ns in each,
    and the steps they cover."""
    forward_ns: int = 0
    backward_ns: int = 0
    optimizer_ns: int = 0
    steps: int = 0

    def to_json(self) -> dict[str, Any]:
        """At the API edge: seconds in each phase since the trainer started, and the steps
        they cover (their mean a step is the report's, run/ and diagnose/)."""
        return {"forward_seconds": self.forward_ns / 1e9, "backward_seconds": self.backward_ns / 1e9,
                "optimizer_seconds": self.optimizer_ns / 1e9, "steps": self.steps}


@dataclasses.dataclass(frozen=True)
class HookReport:
    """One validated hook report. ``raw`` is the decoded message as it came: the parts
    that read more of it (a worker's shard reads, a trainer's CUDA device) validate their
    own keys."""
    ident: Identity
    pid: int                             # the sender as it numbers itself
    role: str                            # "main" (the trainer) or "worker" (a loader worker)
    events: BatchColumns
    mono_ns: int = 0                     # the hook's CLOCK_MONOTONIC when it built it (0: not given)
    wall_ns: int = 0                     # ... and its wall clock
    dropped_total: int = 0               # events the hook dropped, since its process started
    loader: LoaderSettings | None = None
    blocked_since_ns: int | None = None  # a next() call still in progress, since then
    # a delivery of the sender's batch stream (a heartbeat too): every batch it finished
    # before mono_ns came in it or before it; not its shard reads or errors, sent beside
    stream: bool = False
    phases: StepPhases | None = None
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> RankKey:
        """The rank it claims: (namespace, pod, job, rank)."""
        return self.ident.key

    @property
    def main(self) -> bool:
        return self.role == "main"

    @classmethod
    def of(cls, fields: HookReport | Mapping[str, Any]) -> HookReport:
        """A report an in-process caller built as a dict of the validated fields (tests,
        benchmarks), taken at its word: events may be rows, the loader a dict."""
        if isinstance(fields, HookReport):
            return fields
        phases = fields.get("phases")
        if phases is not None and not isinstance(phases, StepPhases):
            phases = StepPhases(**phases)
        return cls(ident=Identity(**fields["id"]), pid=fields["pid"], role=fields.get("role", "main"),
                   events=BatchColumns.of(fields.get("events", ())),
                   mono_ns=fields.get("mono_ns", 0), wall_ns=fields.get("wall_ns", 0),
                   dropped_total=fields.get("dropped_total", 0),
                   loader=LoaderSettings.of(fields.get("loader")),
                   blocked_since_ns=fields.get("blocked_since_ns"), stream=fields.get("stream", False),
                   phases=phases,
                   raw=fields.get("raw") or {})
