"""One report, one story (issue 49): the checks that a diagnosis's verdict line, its
causes' sentences and its predictions do not contradict one another. Each check is a
statement the report makes in two places that must agree; ``contradictions`` lists the
ones that do not, in words. The tests run it over every recorded lab trace and every
drawn scenario; the analysis is what must change when one fires, not the check.
"""
from __future__ import annotations

from ..vocabulary import ATTRIBUTE
from .model import Diagnosis

# causes whose mechanism is the loader's own production of batches: a verdict line that
# says the loader keeps up cannot sit over one of them as the top cause
LOADER_SIDE = frozenset({"too_few_workers", "slow_worker", "storage_latency", "fuse_unhealthy",
                         "bandwidth_bound", "cache_miss", "storage_errors", "shm_exhaustion"})


def contradictions(d: Diagnosis) -> list[str]:
    out: list[str] = []
    top = d.causes[0] if d.causes else None
    if d.rule == "handoff" and top is not None and top.cause in LOADER_SIDE and top.score >= ATTRIBUTE:
        out.append("the verdict says the loader keeps up, the top cause (%s) names the loader"
                   % top.cause)
    throttle = d.cause("cpu_throttle")
    if throttle is not None and throttle.score >= ATTRIBUTE:
        for c in d.causes:
            if "have no CFS quota" in c.summary:
                out.append("%s says the rank has no CFS quota beside cpu_throttle %.2f"
                           % (c.cause, throttle.score))
    if top is not None and top.prediction is not None and "num_workers" in top.prediction.rules_out:
        for c in d.causes[1:]:
            p = c.prediction
            if p is not None and p.settings.num_workers is not None and c.score > 0:
                out.append("%s rules more workers out, %s's prediction raises them"
                           % (top.cause, c.cause))
    loader = d.loader.to_json() if d.loader is not None else {}
    for c in d.causes:
        p = c.prediction
        if p is None:
            continue
        for key, value in p.settings.items():
            if key in loader and loader[key] == value:
                out.append("%s's prediction sets %s=%s, which it already is" % (c.cause, key, value))
    if d.straggler is not None and d.straggler.rank is not None and not d.job_ranks_on_node and \
            _world(d) == 1:
        out.append("a single-rank job names its only rank as the straggler")
    return out


def _world(d: Diagnosis) -> int | None:
    """The job's world size, where the identity carries it."""
    return d.who.world_size
