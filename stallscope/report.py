"""The hook's report as the agent reads it, typed where it enters: the agent's
validation (agent/table/validate.py) makes these from the wire, and everything after
reads their fields, never a dict's keys. JSON only at the edges: ``to_json`` for the
API and the trace files, ``from_json`` for a trace or an answer read back.

A module of its own, standard library only and importing nothing, because both ends
and the pure analysis read it: the agent, the part contract (stallscope/host), the
analysis (stallscope/correlate, which may import neither the agent nor the host), the
on-call command and the lab. A training process never loads it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# The settings the hook reads off a DataLoader, in the order the wire's validation
# writes them; a rank's settings carry these always (None: not reported).
SETTINGS = ("num_workers", "prefetch_factor", "batch_size", "pin_memory", "persistent_workers")
# ... and these when the hook measured or found them.
MEASURED = ("batch_bytes", "dataset_shards")


@dataclasses.dataclass(frozen=True)
class ReportedError:
    """The loader's own error as the hook reported it (hook/errors.py): the exception's
    type and its bounded, sanitised message, and when the hook took it."""
    type: str
    message: str
    at_ns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "at_ns": self.at_ns}


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
    """A DataLoader's settings as its trainer reported them, with what the report says of
    its workers: their PIDs as the trainer numbers them, the exits its waitpid saw, and
    the loader's own error. A rank's settings (``settings()``) leave those three out."""
    num_workers: int | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    batch_bytes: int | None = None       # one batch's tensors, measured by the hook
    dataset_shards: int | None = None    # an iterable dataset's shards (hook/watch.py)
    worker_pids: tuple[int, ...] = ()
    worker_exits: tuple[tuple[int, int], ...] = ()  # (pid, exit code) of workers that ended badly
    error: ReportedError | None = None

    def settings(self) -> LoaderSettings:
        """The settings alone: what a rank keeps and the analysis reads."""
        if not self.worker_pids and not self.worker_exits and self.error is None:
            return self
        return dataclasses.replace(self, worker_pids=(), worker_exits=(), error=None)

    def to_json(self) -> dict[str, Any]:
        """The settings as the API and the trace files have always written them: every
        setting (null where not reported), a measured field where there is one, the
        workers and the error where the report had them."""
        out: dict[str, Any] = {k: getattr(self, k) for k in SETTINGS}
        if self.worker_pids:
            out["worker_pids"] = list(self.worker_pids)
        if self.worker_exits:
            out["worker_exits"] = [list(e) for e in self.worker_exits]
        for k in MEASURED:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out

    @classmethod
    def from_json(cls, body: Mapping[str, Any] | None) -> LoaderSettings | None:
        """Settings from a trace file or an answer (trusted: what this code wrote)."""
        if body is None:
            return None
        err = body.get("error")
        return cls(num_workers=body.get("num_workers"), prefetch_factor=body.get("prefetch_factor"),
                   batch_size=body.get("batch_size"), pin_memory=body.get("pin_memory"),
                   persistent_workers=body.get("persistent_workers"),
                   batch_bytes=body.get("batch_bytes"), dataset_shards=body.get("dataset_shards"),
                   worker_pids=tuple(body.get("worker_pids") or ()),
                   worker_exits=tuple((int(p), int(c)) for p, c in body.get("worker_exits") or ()),
                   error=ReportedError(err["type"], err["message"], err.get("at_ns"))
                   if err is not None else None)

    @classmethod
    def of(cls, value: LoaderSettings | Mapping[str, Any] | None) -> LoaderSettings | None:
        """Settings from what an in-process caller built (tests, benchmarks: a dict)."""
        if value is None or isinstance(value, LoaderSettings):
            return value
        return cls.from_json(value)


# No settings reported: every field None (``(rank.loader or UNREPORTED).num_workers``).
UNREPORTED = LoaderSettings()
