"""What a ``stallscope run`` did, beside the diagnose report of its worst rank: the
command, how it ended, its jobs and the row of each rank (session.final_rows). Typed for
the page, the terminal and ``stallscope compare``; JSON (the report file's ``run``
entry) only when the file is written, and read back once, where compare opens a file
(``SavedRun``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..correlate import codec
from ..correlate.model import Cause


@dataclasses.dataclass(frozen=True)
class RankRow:
    """One rank of the run: its batches (the agent's count), the data-wait share and
    mean step of the correlator's window where it judged one (else of the rank's totals),
    its verdict and top cause; in the final rows also its share without the first batch
    and, where the window holds that batch, the run's start-up apart (session.startup)."""
    job: str | None          # None only in a row read back from a report that left it out
    rank: int | None
    batches: int = 0
    data_wait_ratio: float | None = None
    batches_per_second: float | None = None
    step_seconds_mean: float | None = None
    verdict: str | None = None
    cause: str | None = None
    data_wait_ratio_after_start: float | None = None
    startup_seconds: float | None = None
    step_seconds_mean_after_start: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as the report file has always held it: the start-up's two fields only
        where it was measured."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.startup_seconds is None and self.step_seconds_mean_after_start is None:
            del out["startup_seconds"], out["step_seconds_mean_after_start"]
        return out

    @classmethod
    def from_json(cls, body: Any) -> RankRow:
        if not isinstance(body, Mapping):
            raise ValueError("a rank's row is not an object")
        return _typed(cls, body)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    command: tuple[str, ...]
    exit_status: int | None
    elapsed_seconds: float
    outcome: str                  # ok, failed, interrupted
    outcome_line: str | None      # the line that says how it ended, when it did not end well
    jobs: tuple[str, ...]
    ranks: tuple[RankRow, ...]    # session.final_rows: one row a rank

    @classmethod
    def of(cls, command: Any, exit_status: int | None, elapsed: float, interrupted: bool,
           outcome_line: str | None, jobs: Any, ranks: Any) -> RunOutcome:
        return cls(tuple(command), exit_status, round(elapsed, 1),
                   "interrupted" if interrupted else "failed" if exit_status else "ok",
                   outcome_line, tuple(jobs), tuple(ranks))

    def to_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "exit_status": self.exit_status,
                "elapsed_seconds": self.elapsed_seconds, "outcome": self.outcome,
                "outcome_line": self.outcome_line, "jobs": list(self.jobs),
                "ranks": [r.to_json() for r in self.ranks]}

    @classmethod
    def from_json(cls, body: Any) -> RunOutcome:
        """The ``run`` entry of a report file (what to_json wrote; a field it lacks is
        None, empty or 0)."""
        if not isinstance(body, Mapping):
            raise ValueError("'run' is not an object")
        ranks = body.get("ranks") or []
        if not isinstance(ranks, list):
            raise ValueError("'run.ranks' is not a list")
        return cls(tuple(_of(body, "command", list) or ()), _of(body, "exit_status", int),
                   float(_of(body, "elapsed_seconds", (int, float)) or 0.0), _of(body, "outcome", str) or "",
                   _of(body, "outcome_line", str), tuple(_of(body, "jobs", list) or ()),
                   tuple(RankRow.from_json(r) for r in ranks))


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """A ``stallscope run`` report file read back (compare.py): of the diagnose document,
    the worst rank's headline (its causes decoded by the diagnosis codec), and the run."""
    job: str | None
    rank: Any
    verdict: str | None
    reason: str | None
    data_wait_ratio: float | None
    causes: tuple[Cause, ...]
    run: RunOutcome

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SavedRun:
        """ValueError (codec.Malformed is one) with the reason when a field is not what
        ``stallscope run`` writes."""
        verdict, causes, _straggler, _prediction = codec.decode_headline(doc)
        return cls(_of(doc, "job", str), doc.get("rank"), verdict, _of(doc, "reason", str),
                   _of(doc, "data_wait_ratio", (int, float)), causes, RunOutcome.from_json(doc.get("run")))

    def row(self) -> RankRow | None:
        """The worst rank's row of the run's ranks table (a row without a job is the
        report's job's), or None."""
        for r in self.run.ranks:
            if r.rank == self.rank and (r.job if r.job is not None else self.job) == self.job:
                return r
        return None


def _of(body: Mapping[str, Any], key: str, kind: Any) -> Any:
    """``body[key]`` when it is of ``kind`` (a bool is no number), None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise ValueError("%r is not what a run report holds: %r" % (key, value))
    return value


_KINDS: dict[str, Any] = {"job": str, "rank": int, "batches": int, "verdict": str, "cause": str}


def _typed(cls: Any, body: Mapping[str, Any]) -> Any:
    """``cls`` from the fields of ``body`` it has, each checked for its kind (a number
    unless _KINDS says otherwise); job and rank None where the row left them out."""
    values = {f.name: _of(body, f.name, _KINDS.get(f.name, (int, float)))
              for f in dataclasses.fields(cls) if f.name in body}
    values.setdefault("job", None)
    values.setdefault("rank", None)
    return cls(**values)
