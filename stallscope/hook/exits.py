"""Why a DataLoader's workers ended, as their parent saw it: the exit codes that only the
training process can read once a worker is reaped, sent with the rank's next report
(the agent joins them with the node's evidence: exporters/worker_deaths.py)."""
from __future__ import annotations

import os

from . import channel

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any


def note(it: object, stream: channel.Stream | None) -> None:
    """After the loader raised, in next() or anywhere else (torch raises a worker's death
    from its SIGCHLD handler wherever the main thread is; then the iterator goes away,
    the finalizer of loop.py's iterator): the exit codes of its workers that ended
    badly (-N: by signal N, multiprocessing's convention), sent with the next report so
    the agent can say why ("killed by signal: Bus error" says only what). The parent is the one
    process that can read them once the worker is reaped. Never raises."""
    try:
        exits = [[w.pid, code] for w in getattr(it, "_workers", None) or ()
                 for code in (exit_code(w),) if code]
        if exits and stream is not None and stream.loader is not None:
            stream.loader = dict(stream.loader, worker_exits=exits[:64])
            stream.last_sent = 0.0  # due at the next flush, not the next heartbeat
            channel.get().wake.set()
    except Exception:
        pass


def exit_code(worker: Any) -> int | None:
    """A worker process's exit code, without reaping it: torch's own check for dead
    workers (waitid with WNOWAIT in its SIGCHLD handler) must still find the zombie."""
    popen = getattr(worker, "_popen", None)
    code = getattr(popen, "returncode", None)  # already reaped by torch (join)
    if code is not None or not getattr(worker, "pid", None):
        return code
    try:
        info = os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (OSError, AttributeError):  # not our child, or no waitid
        return None
    if info is None:
        return None  # still running
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status
