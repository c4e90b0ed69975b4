"""memory_limit as a ranked cause (issue 18, item 4): loader workers of the rank were
OOM-killed at the pod's memory limit in the window.

The workers exporter judges each worker's death from the kernel (SIGKILL with the memory
cgroup's oom_kill count up, exporters/worker_deaths.py) and records the kills per
collection (``workers_oom_killed``). A killed worker takes its batches with it: the
DataLoader raises, the job restarts its iterator (or the whole rank), and new workers
start and grow again. So the wait from the first kill on is the kill's: the score is
that share of the window's wait. Waits before it had another cause."""
from typing import Any, Optional

import numpy as np

from ..vocabulary import signal

NAME = "memory_limit"
OOM_KILLED = signal("workers_oom_killed").name


def score(trace: Any) -> Optional[dict]:
    """{cause, score, summary, evidence}, or None without the signal in the window."""
    span = trace.span()
    _, kills = trace.signal(OOM_KILLED, ("rank",))
    if span is None or kills is None:
        return None
    kills = kills.clip(*span)
    if not len(kills):
        return None
    n = int(kills.v.sum())
    total = float(trace.wait.sum())
    if n <= 0 or total <= 0:
        return {"cause": NAME, "score": 0.0, "summary": "No loader worker of the rank was "
                "OOM-killed in the window.", "evidence": [_row(0, 0.0)]}
    first = int(kills.t[np.argmax(kills.v > 0)])
    # a kill is seen at the collection after it: the wait from the collection before on
    # is already the kill's (DataLoader raises as soon as the worker is gone)
    before = kills.t[kills.t < first]
    since = int(before[-1]) if len(before) else span[0]
    share = float(trace.wait[trace.t_end > since].sum()) / total
    text = ("%d loader worker(s) of the rank were OOM-killed at the pod's memory limit in the "
            "window; %.0f%% of the wait came from the first kill on (the loader raised, its "
            "workers started again)." % (n, 100 * share))
    return {"cause": NAME, "score": round(share, 4), "summary": text, "evidence": [_row(n, share)]}


def _row(n: int, share: float) -> dict:
    return {"signal": OOM_KILLED, "scope": "rank", "during_stalls": n, "outside_stalls": None,
            "threshold": 0, "direction": "above", "explained_wait_share": round(share, 6)}
