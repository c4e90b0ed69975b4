"""A lab rank that outlives a loader worker's death (the shm-bus-error and oom-kill
scenarios): torch raises "DataLoader worker (pid N) is killed by signal: ..." from its
SIGCHLD handler, wherever the loop is, or "... exited unexpectedly" from next() once its
status check finds the worker gone; the rank then drops the broken iterator and starts a
new one, as a job that restarts its loader does, and the agent sees both the death and
the wait it cost."""
import gc


def worker_died(error):
    """Is ``error`` the DataLoader's report of a dead worker? (torch's own words,
    torch/utils/data/dataloader.py and _utils/signal_handling.py)"""
    text = str(error)
    return "DataLoader worker" in text and ("killed by signal" in text or "exited unexpectedly" in text)


def drop_iterator(dl):
    """Shut down the iterator whose worker died, so the next iter() starts new workers.
    Its dead workers are reaped first: torch's SIGCHLD handler names every registered
    worker that is still a zombie, and would raise again as the others exit. Persistent
    workers keep the iterator on the loader; otherwise the loop's reference is gone and
    the collection finishes it."""
    for _ in range(5):
        try:
            it, dl._iterator = getattr(dl, "_iterator", None), None
            if it is not None:
                for w in it._workers:
                    w.exitcode  # noqa: B018 (a non-blocking waitpid: reaps a dead worker)
                it._shutdown_workers()
            gc.collect()
            return
        except RuntimeError as e:  # another worker's death, reported as it is reaped
            if not worker_died(e):
                raise
