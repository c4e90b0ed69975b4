"""What the host knows of a rank beyond its trace, as the analysis takes it: one typed
value (issue 49, item 4), where the analysis took a quota dict, a memory value, the
set-up and the loader's error as four shapes. The agent builds it from its exporters'
host facts (agent/parts/correlator.py); a recorded trace has none (RankFacts())."""
from __future__ import annotations

import dataclasses

from ..report import ReportedError
from .checks import SetUp
from .queue import Memory


@dataclasses.dataclass(frozen=True)
class RankFacts:
    """``quota_measured``: the cfs exporter collected the rank (then ``quota_cores`` None
    means no quota); ``quota_ranks``: ranks whose training process shares that quota;
    ``cpus``: the CPUs its cpuset allows; ``io_read_limit``: bytes a second its cgroup may
    read from its device; ``memory``: its memory limit and its workers' size; ``setup``:
    what its set-up checks are judged on; ``loader_error``: the loader's own error as
    the hook reported it."""
    quota_measured: bool = False
    quota_cores: float | None = None
    quota_ranks: int | None = None
    cpus: int | None = None
    io_read_limit: float | None = None
    memory: Memory | None = None
    setup: SetUp | None = None
    loader_error: ReportedError | None = None


NONE = RankFacts()
