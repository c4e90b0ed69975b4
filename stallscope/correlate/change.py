"""Proof afterwards (issue 17): when a rank's loader settings (or the CPU quota over it)
change, the agent marks the moment; the diagnosis then shows the rank's data-wait and
step time before -> after it, beside the prediction made before the change.

Before and after are the steady batches on each side of the mark (an iterator's first
batch waits for its workers to start: that is epoch_start's, not the new settings'
steady pace)."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..vocabulary import DATA_WAIT_LINE
from .overlap import iterator_starts

WATCHED = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")
MIN_AFTER = 5   # fewer steady batches after the change: "after" is not measured yet


def settings_of(loader: dict | None, quota_cores: float | None) -> dict[str, Any]:
    out = {k: (loader or {}).get(k) for k in WATCHED}
    out["cpu_quota_cores"] = quota_cores
    return out


def mark(old: dict, new: dict, at_ns: int, prediction: dict | None) -> dict[str, Any]:
    what = ", ".join("%s %s -> %s" % (k, old.get(k), new.get(k)) for k in new if old.get(k) != new.get(k))
    return {"at_ns": int(at_ns), "at_wall": time.strftime("%H:%M:%S"), "what": what,
            "from": old, "to": new, "predicted": prediction}


def _stats(trace: Any, keep: np.ndarray) -> dict[str, Any] | None:
    keep = keep & ~iterator_starts(trace)
    n = int(keep.sum())
    if n < MIN_AFTER:
        return None
    interval, wait = trace.interval[keep], trace.wait[keep]
    return {"batches": n, "data_wait_ratio": round(float(wait.sum() / interval.sum()), 6),
            "step_seconds": round(float(interval.mean()) / 1e9, 6)}


def view(marked: dict, trace: Any) -> dict[str, Any]:
    """The mark with before/after measured on ``trace``, and how the prediction did."""
    after_mask = trace.t_end > marked["at_ns"]
    out = dict(marked, before=_stats(trace, ~after_mask), after=_stats(trace, after_mask))
    a, p = out["after"], marked.get("predicted") or {}
    out["stall_gone"] = a is not None and a["data_wait_ratio"] < DATA_WAIT_LINE
    if a is not None and p.get("predicted_step_seconds"):
        out["step_error"] = round((p["predicted_step_seconds"] - a["step_seconds"]) / a["step_seconds"], 4)
    return out
