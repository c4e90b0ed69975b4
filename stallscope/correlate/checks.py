"""Set-up checks at the first batch (issue 32, item 3): the vocabulary's checks
(vocabulary/checks.py) judged on the loader's settings, as the hook reports them at
iterator start, and what the agent knows of the rank's pod (``SetUp``). No stall is
needed and none is implied: a failed check is a ``SetupWarning`` beside the verdict,
never a cause and never a page.

What is not known is not judged: a check whose inputs are missing (no GPU fact, no
/dev/shm reading, no batch measured yet, one iterator start so far) is skipped, not
passed, and ``unknown`` says which.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import vocabulary
from ..report import LoaderSettings
from ..vocabulary.checks import DEFAULT_PREFETCH
from .model import SetupWarning
from .trace import RankTrace

CHECK = vocabulary.check_of


@dataclasses.dataclass(frozen=True)
class SetUp:
    """What a rank's checks are judged on. None: not measured.

    ``gpu``: whether the rank drives a GPU (the gpu exporter's RankGpu fact, or the CUDA
    device the hook saw); ``cpu_limit_cores``: the CFS quota over the rank's cgroup in
    cores (RankQuota; None also when there is no quota); ``shm_size_bytes``: the size of
    /dev/shm in the rank's mount namespace (the shm exporter); ``wants_pinned``: the pod
    asks for CPUs of its own (a GPU rank, or Guaranteed QoS); ``epoch_seconds`` and
    ``startup_seconds``: from the rank's iterator starts (``epochs``)."""
    loader: LoaderSettings | None
    gpu: bool | None = None
    cpu_limit_cores: float | None = None
    quota_measured: bool = False
    shm_size_bytes: int | None = None
    wants_pinned: bool | None = None
    epoch_seconds: float | None = None
    startup_seconds: float | None = None

    def __post_init__(self) -> None:
        # settings built in code (tests, the lab) may come as a dict: typed here, once
        object.__setattr__(self, "loader", LoaderSettings.of(self.loader))


def epochs(trace: RankTrace) -> tuple[float | None, float | None]:
    """(the median epoch's run time without its start-up, the mean start-up) from the
    trace's iterator starts (the hook gives an iterator's first batch interval == wait):
    an epoch runs from its first batch to the start of the next iterator's first next()."""
    if not trace.n:
        return None, None
    starts = np.flatnonzero(trace.interval == trace.wait)
    if len(starts) < 2:
        return None, None
    ends = trace.t_end[starts].astype(np.float64)
    waits = trace.wait[starts].astype(np.float64)
    runs = (ends[1:] - waits[1:]) - ends[:-1]
    return float(np.median(runs)) / 1e9, float(waits.mean()) / 1e9


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d B" % n


def _fmt(unit: str, v: Any) -> str:
    if unit == "bytes":
        return human_bytes(float(v))
    if unit == "seconds":
        return "%.2fs" % float(v)
    if unit == "cores":
        return "%g" % float(v)
    return str(v)


def _warn(name: str, value: Any, line: Any) -> SetupWarning:
    c = CHECK(name)
    text = c.text.replace("<value>", _fmt(c.unit, value)).replace("<line>", _fmt(c.unit, line))
    return SetupWarning(c.name, c.measure, value, line, text, c.fix)


def evaluate(s: SetUp) -> tuple[tuple[SetupWarning, ...], tuple[str, ...]]:
    """(the failed checks, the checks that could not be judged) for one rank."""
    warnings: list[SetupWarning] = []
    unknown: list[str] = []
    loader = s.loader
    if loader is None:  # not a DataLoader (or its settings not reported): nothing to judge
        return (), tuple(c.name for c in vocabulary.CHECKS)
    workers = loader.num_workers
    prefetch = loader.prefetch_factor or DEFAULT_PREFETCH
    batch = loader.batch_bytes

    if s.gpu is None or workers is None:
        unknown.append("no_workers_with_gpu")
    elif s.gpu and workers == 0:
        warnings.append(_warn("no_workers_with_gpu", 0, 1))

    if not workers:
        pass  # no worker holds a batch in /dev/shm: nothing to size
    elif s.shm_size_bytes is None or not batch:
        unknown.append("shm_too_small")
    else:
        need = int(workers * prefetch * batch)
        if s.shm_size_bytes < need:
            warnings.append(_warn("shm_too_small", s.shm_size_bytes, need))

    if not s.quota_measured or workers is None:
        unknown.append("workers_over_quota")
    elif s.cpu_limit_cores is not None and workers > s.cpu_limit_cores:
        warnings.append(_warn("workers_over_quota", workers, s.cpu_limit_cores))

    if not s.quota_measured or s.wants_pinned is None:
        unknown.append("fractional_cpu_limit")
    elif s.wants_pinned and s.cpu_limit_cores is not None and \
            abs(s.cpu_limit_cores - round(s.cpu_limit_cores)) > 1e-3:
        warnings.append(_warn("fractional_cpu_limit", round(s.cpu_limit_cores, 3),
                              max(1, round(s.cpu_limit_cores))))

    pin = loader.pin_memory
    if s.gpu is None or pin is None:
        unknown.append("pin_memory_off_with_gpu")
    elif s.gpu and pin is False:
        warnings.append(_warn("pin_memory_off_with_gpu", False, True))

    if not workers or loader.persistent_workers:
        pass  # no workers to restart, or they persist
    elif s.epoch_seconds is None or s.startup_seconds is None:
        unknown.append("workers_restart_each_epoch")
    elif s.epoch_seconds < s.startup_seconds:
        warnings.append(_warn("workers_restart_each_epoch", round(s.epoch_seconds, 3),
                              round(s.startup_seconds, 3)))
    return tuple(warnings), tuple(unknown)
