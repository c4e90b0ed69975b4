"""The loader's own errors (issue 32, item 4): what the exception the watched next()
raised says about its cause. The hook reports its type and a bounded message once
(hook/errors.py); the message is the pod's own text, matched here, never trusted
further than naming a cause.

- torch >= 2.x reserves each shared-memory segment up front (posix_fallocate in
  ``THManagedMapAllocator``), so a full /dev/shm fails a worker's allocation: the worker
  raises "unable to allocate shared memory(shm) for file ...: No space left on device
  (28)" and the loader re-raises it in the trainer as "Caught RuntimeError in DataLoader
  worker process N". No worker dies and no signal is counted: only this names it. It is
  ``shm_exhaustion``, with the size that would have been enough: num_workers x
  prefetch_factor x the measured batch bytes (each worker keeps up to prefetch_factor
  batches in flight there).
- "DataLoader worker (pid N) is killed by signal: Bus error": the SIGBUS of a worker
  touching a shm page the full tmpfs cannot back (older torch): ``shm_exhaustion`` too.
- "... is killed by signal: Killed" and a timeout: the error is shown as it came;
  the worker deaths (deaths.py) and the hang triage judge those.
"""
from __future__ import annotations

from ..report import UNREPORTED, LoaderSettings, ReportedError
from ..vocabulary.checks import DEFAULT_PREFETCH
from .checks import human_bytes
from .model import LoaderError

SHM = "shm_exhaustion"
_SHM_MARKS = ("unable to allocate shared memory", "bus error")


def needed_shm_bytes(loader: LoaderSettings) -> int | None:
    """num_workers x prefetch_factor x the measured batch bytes; None when not measured."""
    workers, batch = loader.num_workers, loader.batch_bytes
    if not workers or not batch:
        return None
    return int(workers * (loader.prefetch_factor or DEFAULT_PREFETCH) * batch)


def judge(error: ReportedError, loader: LoaderSettings | None,
          shm_size_bytes: int | None = None) -> LoaderError:
    """The typed LoaderError of a reported error, with its cause where the message names one."""
    kind, message = error.type, error.message
    at = error.at_ns
    low = message.lower()
    base = LoaderError(kind, message, at if isinstance(at, int) else None, shm_size_bytes=shm_size_bytes)
    if any(m in low for m in _SHM_MARKS) or ("no space left on device" in low and "shm" in low):
        need = needed_shm_bytes(loader or UNREPORTED)
        text = "The loader failed to allocate a batch in /dev/shm (%s: %s)" % (kind, message[:160])
        if shm_size_bytes is not None:
            text += "; /dev/shm is %s" % human_bytes(shm_size_bytes)
        if need is not None:
            text += ("; num_workers x prefetch_factor x the measured batch (%s) need %s: give the "
                     "pod a /dev/shm of at least that" % (
                         human_bytes((loader or UNREPORTED).batch_bytes or 0), human_bytes(need)))
        else:
            text += "; no batch was measured, so the size that is enough is not known"
        return LoaderError(kind, message, base.at_ns, SHM, need, shm_size_bytes, text + ".")
    return LoaderError(kind, message, base.at_ns, None, None, shm_size_bytes,
                       "The loader raised %s: %s" % (kind, message[:160]))
