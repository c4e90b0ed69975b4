"""What the fix will buy and what the stall costs now (issue 17), for the report:

- ``prediction``: the top cause's, from the agent's correlator (correlate/predict.py),
  when the verdict is the agent's;
- ``headroom``: the most any input-side fix can give, for the rank (its step with no
  wait) and for the job (in synchronous training the job moves at the straggler's pace,
  so the job's step shrinks by the straggler's waiting share);
- ``cost``: accelerator time idle on input wait. Every rank of a synchronous job idles
  while the straggler waits, so the job loses world size x the straggler's waiting
  share of its wall time; the rank alone, its own share. The same quantity the
  recording rule ``job:stallscope_idle_accelerators:max_rate5m`` gives Prometheus.
- ``change``: a loader-setting or CPU-limit change the agent marked, with before ->
  after against the prediction made before it (correlate/change.py).
"""

from __future__ import annotations

from ..correlate import capacity
from ..correlate.model import Cause, Change, Diagnosis, Prediction
from .document import Cost, JobHeadroom, RankHeadroom, Report

DAY_HOURS = 24.0


def _speedup(ratio: float | None) -> float | None:
    return round(1.0 / (1.0 - ratio), 3) if ratio is not None and ratio < 1 else None


def headroom(data_wait_ratio: float | None, job_max: float | None, job_scope: str,
             diag: Diagnosis | None) -> tuple[RankHeadroom | None, JobHeadroom | None]:
    h = diag.headroom if diag is not None else None
    rank = None
    if h is not None:
        rank = RankHeadroom(h.data_wait_ratio, h.speedup, h.step_seconds, h.step_seconds_without_wait)
    elif data_wait_ratio is not None:
        rank = RankHeadroom(data_wait_ratio, _speedup(data_wait_ratio))
    job = None
    if job_max is not None:
        job = JobHeadroom(job_max, _speedup(job_max), job_scope,
                          round(rank.step_seconds * (1 - job_max), 6)
                          if rank is not None and rank.step_seconds else None)
    return rank, job


def cost(verdict: str, causes: tuple[Cause, ...], data_wait_ratio: float | None, job_max: float | None,
         world: int, scope: str) -> Cost | None:
    """Idle accelerators now."""
    if job_max is None or not world:
        return None
    idle = world * job_max
    named = [c for c in causes if c.score > 0]
    return Cost(world, round(job_max, 6), round(idle, 4), round(idle * DAY_HOURS, 3),
                round(data_wait_ratio * DAY_HOURS, 3) if data_wait_ratio is not None else None, scope,
                named[0].cause if named and verdict == "input_bound" else None)


def prediction(verdict: str, diag: Diagnosis | None) -> Prediction | None:
    """The agent's prediction, when the verdict is the agent's too."""
    if verdict == "input_bound" and diag is not None and diag.verdict == verdict:
        return diag.prediction
    return None


def plural(n: int, noun: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def lines(doc: Report) -> list[str]:
    """The report's lines for prediction, headroom, cost and a marked change."""
    out = []
    p = doc.prediction
    if p is not None:
        out.append("Prediction (%s, confidence %s): %s -> data-wait %.1f%%, step %.3gs (x%s faster)" % (
            p.cause, p.confidence, p.change, 100 * p.predicted_data_wait_ratio,
            p.predicted_step_seconds, p.speedup))
        out.append("  basis: %s" % p.basis)
        if p.bound_by:  # the capacity that binds it (correlate/capacity.py)
            out.append("  bound by: the %s" % capacity.NAMES.get(p.bound_by, p.bound_by))
    r, j = doc.rank_headroom, doc.job_headroom
    if (r is not None and r.speedup) or (j is not None and j.speedup):
        text = "Headroom (every input wait gone):"
        if r is not None and r.step_seconds_without_wait and r.step_seconds:
            text += " rank step %.3gs -> %.3gs (x%s);" % (r.step_seconds, r.step_seconds_without_wait,
                                                          r.speedup)
        elif r is not None and r.speedup:
            text += " rank x%s;" % r.speedup
        if j is not None and j.speedup:
            text += " job x%s (the straggler waits %.1f%%)" % (j.speedup, 100 * j.data_wait_ratio)
        out.append(text.rstrip(";"))
    c = doc.cost
    # a stall's cost only (issue 52: "this stall costs" on a healthy run), and in
    # accelerator-hours only where there are accelerators: not where the agent read none
    no_gpu = doc.gpu is not None and not doc.gpu.samples
    if c is not None and c.waiting_share > 0 and doc.verdict in ("input_bound", "not_input_bound") \
            and not no_gpu:
        text = ("Cost now: this stall costs %.1f GPU-hours a day (%s x %.1f%% waiting%s)" % (
            c.gpu_hours_per_day, plural(c.world_size, "rank"), 100 * c.waiting_share,
            ", this node's ranks only" if c.scope == "node" else ""))
        if c.cause:
            text += ", attributed to %s" % c.cause
        out.append(text + ".")
    if doc.change is not None:
        out.append(change_line(doc.change))
    return out


def change_line(ch: Change) -> str:
    """A marked change (correlate/change.py), before -> after."""
    b, a = ch.before, ch.after
    text = "Change at %s: %s. Before -> after: data-wait %s -> %s, step %s -> %s" % (
        ch.mark.at_wall, ch.mark.what, _pc(b.data_wait_ratio if b else None),
        _pc(a.data_wait_ratio if a else None), _s(b.step_seconds if b else None),
        _s(a.step_seconds if a else None))
    p = ch.mark.predicted
    if p is not None:
        text += " (predicted %s, step %s)" % (_pc(p.predicted_data_wait_ratio), _s(p.predicted_step_seconds))
    text += "; the stall is %s." % ("gone" if ch.stall_gone else "still there")
    return text


def _pc(x: float | None) -> str:
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def _s(x: float | None) -> str:
    return "n/a" if x is None else "%.3gs" % x
