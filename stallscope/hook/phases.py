"""Step phases: forward, backward and the optimizer step, timed from a framework's own
hooks (issue 34, item 7: stallscope/integrations/ calls these; no user code).

One process, one training loop: ``begin(name)`` ends the phase running (if any) and
starts ``name``; ``end_step()`` ends it and counts a step. Totals are cumulative since
the process started (what the agent keeps is the last report: a lost report loses
nothing) and go out with the training loop's batch reports (channel.py) as
``{"forward_ns": ..., "backward_ns": ..., "optimizer_ns": ..., "steps": n}``.

A perf_counter_ns and a list add a call, four calls a step; never raises.
"""
from __future__ import annotations

from time import perf_counter_ns

NAMES = ("forward", "backward", "optimizer")
_INDEX = {name: i for i, name in enumerate(NAMES)}


class StepPhases:
    __slots__ = ("totals", "steps", "_phase", "_mark")

    def __init__(self) -> None:
        self.totals = [0, 0, 0]  # ns in each of NAMES
        self.steps = 0
        self._phase = -1         # the phase running, -1: none
        self._mark = 0           # when it began

    def begin(self, name: str, after: str | None = None) -> None:
        """Start ``name`` (ending the phase running); with ``after``, only when that
        phase is the one running (a forward hook fires for evaluation too)."""
        try:
            if after is not None and self._phase != _INDEX[after]:
                return
            now = perf_counter_ns()
            self._close(now)
            self._phase, self._mark = _INDEX[name], now
        except Exception:
            pass

    def end_step(self) -> None:
        try:
            if self._phase >= 0:
                self._close(perf_counter_ns())
                self.steps += 1
        except Exception:
            pass

    def _close(self, now: int) -> None:
        if self._phase >= 0:
            self.totals[self._phase] += now - self._mark
            self._phase = -1

    def snapshot(self) -> dict[str, int] | None:
        """What the report carries; None before the first step."""
        if not self.steps:
            return None
        out = {name + "_ns": total for name, total in zip(NAMES, self.totals)}
        out["steps"] = self.steps
        return out


_current = StepPhases()


def get() -> StepPhases:
    return _current
