"""What a ``stallscope run`` did, beside the diagnose report of its worst rank: the
command, how it ended, its jobs and the row of each rank (session.final_rows). Typed for
the page and the terminal; JSON (the report file's ``run`` entry) only when the file is
written."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    command: tuple[str, ...]
    exit_status: int | None
    elapsed_seconds: float
    outcome: str                  # ok, failed, interrupted
    outcome_line: str | None      # the line that says how it ended, when it did not end well
    jobs: tuple[str, ...]
    ranks: tuple[Mapping[str, Any], ...]  # session.final_rows: one row a rank

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
                "ranks": [dict(r) for r in self.ranks]}
