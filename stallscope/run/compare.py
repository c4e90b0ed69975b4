"""``stallscope compare A.json B.json``: two ``stallscope run`` reports (diagnose's
document of the worst rank plus the run's ranks) side by side, as a gate for CI.

- B regressed when its worst rank's data-wait share exceeds A's by more than
  ``threshold`` (points of step time, like the alert line: the loop spends that much
  more of each step waiting), or its step time exceeds A's by more than
  ``step_threshold`` (a fraction of A's step: a slower step with no more waiting is a
  regression the data-wait alone misses, issue 34).
- A run that failed (non-zero exit, interrupted) or could not be judged (verdict
  ``unknown``: too short, no batches in the window) proves nothing either way: the gate
  fails with its own exit code instead of saying ``ok`` (issue 34: a crashed B passed).

- By default both runs are compared in their steady state: the run's first batch, its
  workers' start (paid once per run, and longer on a loaded machine), left out of the
  data-wait share and the step time, and reported beside them as ``start-up`` (issue
  52: a run that followed stallscope's own advice, more workers, waited 1.0 % once
  started and 6.1 % with its start, and failed the gate). ``whole_run`` counts it.

Exit codes: 0 no regression, 1 regressed, 2 a file is not a run report, 3 a run failed
or could not be judged.
"""
from __future__ import annotations

import dataclasses
import json

from .outcome import SavedRun

OK, REGRESSED, BAD_INPUT, NOT_JUDGED = 0, 1, 2, 3


def fraction(text):
    """``2%`` or ``0.02`` -> 0.02; ValueError with the reason otherwise."""
    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError("%r is not a fraction: write 2%% or 0.02" % text) from None
    if not 0.0 <= v <= 1.0:
        hint = "" if s.endswith("%") else " (for %s percent write %s%%)" % (s, s)
        raise ValueError("%r is outside 0..1 (0%%..100%%)%s" % (text, hint))
    return v


def load(path):
    """The run report at ``path``, decoded once (outcome.SavedRun); ValueError with the
    reason when it is not one."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError as e:
        raise ValueError("%s is not JSON: %s" % (path, e)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("run"), dict) or \
            not isinstance(doc.get("data_wait_ratio"), (int, float, type(None))) or \
            "data_wait_ratio" not in doc:
        raise ValueError("%s is not a stallscope run report (no 'run' and 'data_wait_ratio')" % path)
    try:
        return SavedRun.from_json(doc)
    except ValueError as e:
        raise ValueError("%s is not a stallscope run report: %s" % (path, e)) from None


def step_seconds(saved, whole_run=True):
    """The worst rank's mean interval between batches: its step time; without its first
    batch unless ``whole_run`` (and where the report has it)."""
    row = saved.row()
    if row is None:
        return None
    if not whole_run and row.step_seconds_mean_after_start is not None:
        return row.step_seconds_mean_after_start
    return row.step_seconds_mean


def data_wait(saved, whole_run=True):
    """The worst rank's data-wait share; without its first batch unless ``whole_run``."""
    row = saved.row()
    if not whole_run and row is not None and row.data_wait_ratio_after_start is not None:
        return row.data_wait_ratio_after_start
    return saved.data_wait_ratio


def startup_seconds(saved):
    """The worst rank's first batch (its workers' start), when the report has it."""
    row = saved.row()
    return row.startup_seconds if row is not None else None


def why_not_judged(saved):
    """Why the run proves nothing (it failed, or has no verdict), or None."""
    code = saved.run.exit_status
    if saved.run.outcome == "interrupted":
        return "was interrupted (exit status %s)" % code
    if code not in (0, None):
        return "failed (exit status %s)" % code
    if saved.verdict in (None, "unknown") or saved.data_wait_ratio is None:
        return "could not be judged: %s" % (saved.reason or "verdict unknown")
    return None


def _s(v):
    return "%.3fs" % v if v is not None else "n/a"


def _pct(v):
    return "%.1f%%" % (100 * v) if v is not None else "n/a"


@dataclasses.dataclass(frozen=True)
class Side:
    """One run's side of the comparison."""
    path: str
    verdict: str | None
    reason: str | None
    data_wait_ratio: float | None       # what is compared: steady state unless the whole run
    step_seconds: float | None
    whole_run_data_wait_ratio: float | None
    whole_run_step_seconds: float | None
    startup_seconds: float | None
    causes: tuple[str, ...]             # those with a score, best first
    exit_status: int | None
    not_judged: str | None              # why the run proves nothing, or None

    @classmethod
    def of(cls, path, saved, whole_run):
        return cls(path, saved.verdict, saved.reason, data_wait(saved, whole_run),
                   step_seconds(saved, whole_run), saved.data_wait_ratio, step_seconds(saved),
                   startup_seconds(saved),
                   tuple(c.cause for c in saved.causes if c.score > 0), saved.run.exit_status,
                   why_not_judged(saved))

    def to_json(self):
        return dict(dataclasses.asdict(self), causes=list(self.causes))


@dataclasses.dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    whole_run: bool
    wait_delta: float | None            # B's data-wait less A's, in points of step time
    threshold: float
    step_change: float | None           # B's step time against A's, a fraction of A's
    step_threshold: float
    code: int                           # the command's exit status

    @property
    def wait_regressed(self):
        return self.wait_delta is not None and self.wait_delta > self.threshold

    @property
    def step_regressed(self):
        return self.step_change is not None and self.step_change > self.step_threshold

    def to_json(self):
        """What --json prints."""
        return {"a": self.a.to_json(), "b": self.b.to_json(),
                "compared": "whole_run" if self.whole_run else "steady_state",
                "data_wait": {"delta_points": self.wait_delta, "threshold_points": self.threshold,
                              "regressed": self.wait_regressed},
                "step": {"change": self.step_change, "threshold": self.step_threshold,
                         "regressed": self.step_regressed},
                "result": {OK: "ok", REGRESSED: "regressed", NOT_JUDGED: "not_judged"}[self.code],
                "exit_code": self.code}


def result(a_path, b_path, threshold, step_threshold, whole_run=False):
    """The comparison (its JSON is what --json prints): steady states, unless
    ``whole_run``."""
    a, b = Side.of(a_path, load(a_path), whole_run), Side.of(b_path, load(b_path), whole_run)
    wa, wb = a.data_wait_ratio, b.data_wait_ratio
    sa, sb = a.step_seconds, b.step_seconds
    wait_delta = wb - wa if wa is not None and wb is not None else None
    step_change = (sb - sa) / sa if sa and sb is not None else None
    r = Comparison(a, b, whole_run, wait_delta, threshold, step_change, step_threshold, OK)
    if a.not_judged or b.not_judged:
        code = NOT_JUDGED
    else:
        code = REGRESSED if r.wait_regressed or r.step_regressed else OK
    return dataclasses.replace(r, code=code)


def text(r):
    a, b = r.a, r.b
    steady = not r.whole_run
    rows = [("data-wait", _pct(a.data_wait_ratio), _pct(b.data_wait_ratio)),
            ("step time", _s(a.step_seconds), _s(b.step_seconds))]
    if steady:
        whole = ["%s, %s" % (_pct(x.whole_run_data_wait_ratio), _s(x.whole_run_step_seconds)) for x in (a, b)]
        rows += [("whole run", whole[0], whole[1])]
    rows += [("start-up", _s(a.startup_seconds), _s(b.startup_seconds)),
            ("verdict", a.verdict, b.verdict),
            ("causes", ", ".join(a.causes[:3]) or "-", ", ".join(b.causes[:3]) or "-"),
            ("exit status", a.exit_status, b.exit_status)]
    width = max(24, max(len(str(x)) for _, x, _ in rows) + 2)
    out = ["%-12s %-*s %s" % ("", width, "A " + a.path, "B " + b.path)]
    out += ["%-12s %-*s %s" % (name, width, x, y) for name, x, y in rows]
    out.append("Compared: %s" % (
        "the steady state: data-wait and step time without each run's first batch (its "
        "workers' start, the start-up row); --whole-run counts it" if steady else
        "the whole runs, start-up included"))
    for side, name in ((a, "A (the baseline)"), (b, "B")):
        if side.not_judged:
            out.append("NOT JUDGED: %s %s; the comparison proves nothing" % (name, side.not_judged))
    if r.wait_delta is not None:
        out.append("%s: B's data-wait is %+.1f points of step time against A's (threshold %.1f points)" % (
            "REGRESSED" if r.wait_regressed else "ok", 100 * r.wait_delta, 100 * r.threshold))
    if r.step_change is not None:
        out.append("%s: B's step time is %+.1f%% against A's (threshold %.1f%%)" % (
            "REGRESSED" if r.step_regressed else "ok", 100 * r.step_change, 100 * r.step_threshold))
    else:
        out.append("step time: not compared (a report has no step time for its worst rank)")
    return "\n".join(out) + "\n"


def main(a_path, b_path, threshold, step_threshold, as_json, out, err, whole_run=False):
    """The command's exit status (see the module docstring); one line on ``err`` when a
    file is not a run report."""
    try:
        r = result(a_path, b_path, threshold, step_threshold, whole_run)
    except (ValueError, KeyError, TypeError) as e:
        print("stallscope compare: %s" % e, file=err)
        return BAD_INPUT
    if as_json:
        out.write(json.dumps(r.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(text(r))
    return r.code
