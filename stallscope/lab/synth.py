"""Synthetic timelines with known answers, for the unit tests, the evaluation set and the
benchmark. Nothing here runs inside the agent.

``simulate`` models a DataLoader the way PyTorch runs one: W workers take batches in
turn (batch k goes to worker k mod W), a worker starts batch k once it has finished its
previous batch and once the batch has been requested, and the loop keeps
``prefetch_factor x W`` batches requested ahead (a new request each time it takes one).
The loop waits for batch k, computes, and asks for the next. With W = 0 the loop loads
each batch itself. Its output is a ``/api/v1/timeline`` body, so it goes through the
same parsing as recorded traces.
"""
import numpy as np

SEC = 1_000_000_000


def simulate(n, workers, load, compute, prefetch=2, t0=10 * SEC, extra=None, collective=None,
             transfer=None, completions=None):
    """Batch events of ``n`` batches. ``load(k, t_s)`` and ``compute(k, t_s)`` give seconds;
    ``extra(k, t_s)`` adds a wait on top (a stuck read); ``collective(k, t_s)`` adds time
    after compute in which the GPU is idle but the loop is not waiting on data;
    ``transfer(k, t_s)`` is the time the loop takes to get a ready batch from the workers
    (receive, unpickle): with it, each event carries a fourth number, its ready wait (the
    hook's split, hook/transfer.py). ``completions``: a list that gets each worker batch's
    (done ns, worker index, load seconds), as the workers' own reports carry them.
    Returns (events, compute_phases) with phases as [(start_ns, end_ns)] of GPU work."""
    events, phases = [], []
    ready = {}
    request = {k: t0 for k in range(min(n, max(workers, 1) * prefetch))}
    worker_free = [t0] * max(workers, 1)
    t = t0
    prev_end = None
    for k in range(n):
        if workers == 0:
            got = t + int(load(k, t / SEC) * SEC)
        else:
            for j in range(k, min(n, k + workers * prefetch)):  # batches requested by now
                if j not in ready and j in request:
                    w = j % workers
                    start = max(worker_free[w], request[j])
                    took = load(j, start / SEC)
                    worker_free[w] = ready[j] = start + int(took * SEC)
                    if completions is not None:
                        completions.append((ready[j], w, took))
            got = max(t, ready.pop(k))
        if extra is not None:
            got += int(extra(k, got / SEC) * SEC)
        ready_wait = got - t
        if transfer is not None:
            got += int(transfer(k, got / SEC) * SEC)
        wait = got - t
        event = (got, wait, got - prev_end if prev_end is not None else wait)
        events.append(event if transfer is None else event + (ready_wait,))
        prev_end = got
        if workers:
            request[k + workers * prefetch] = got
        c = int(compute(k, got / SEC) * SEC)
        phases.append((got, got + c))
        t = got + c
        if collective is not None:
            t += int(collective(k, t / SEC) * SEC)
    return events, phases


def gpu_samples(phases, start, end, every=0.1):
    """Simulated GPU busy ratio per ``every`` seconds: the share of each interval covered
    by compute phases (the lab's simulated GPU does the same)."""
    step = int(every * SEC)
    edges = np.arange(start + step, end + 1, step, dtype=np.int64)
    ph = np.asarray(phases, np.int64).reshape(-1, 2)
    cum = np.concatenate(([0], np.cumsum(ph[:, 1] - ph[:, 0])))

    def busy_before(t):
        k = np.searchsorted(ph[:, 1], t, side="right")
        kk = np.minimum(k, len(ph) - 1)
        part = np.where(k < len(ph), np.clip(t - ph[kk, 0], 0, ph[kk, 1] - ph[kk, 0]), 0)
        return cum[k] + part

    busy = (busy_before(edges) - busy_before(edges - step)) / step
    return [[int(t), float(b)] for t, b in zip(edges, busy)]


def sampled(fn, start, end, every=2.0):
    """[[t_ns, fn(t_s)]] every ``every`` seconds across [start, end]."""
    ts = np.arange(start + int(every * SEC), end + 1, int(every * SEC), dtype=np.int64)
    return [[int(t), float(fn(t / SEC))] for t in ts]


def body(events, rank=0, job="synthetic", workers=None, signals=None, node_signals=None,
         gpu=None, gpu_source="simulated", pod=None):
    """A /api/v1/timeline body from events and sample lists."""
    out = {"rank": {"job": job, "rank": rank, "local_rank": rank, "world_size": 8,
                    "pod": pod or "%s-%d" % (job, rank), "namespace": "lab", "node": "node-a"},
           "clock": "CLOCK_MONOTONIC ns",
           "loader": None if workers is None else {
               "num_workers": workers, "prefetch_factor": 2 if workers else None,
               "pin_memory": False, "persistent_workers": True, "batch_size": 32},
           "batches": [dict({"t_end_ns": int(e[0]), "wait_ns": int(e[1]), "interval_ns": int(e[2])},
                            **({"ready_wait_ns": int(e[3])} if len(e) > 3 else {}))
                       for e in events],
           "signals": dict(signals or {}), "node_signals": dict(node_signals or {})}
    if gpu is not None:
        out["signals"]["gpu_busy_ratio"] = gpu
        out["gpu"] = {"source": gpu_source}
    if events:
        out["seconds"] = round((events[-1][0] - events[0][0] + events[0][2]) / SEC, 3)
    return out


def span_of(events):
    return events[0][0] - events[0][2], events[-1][0]


def jitter(rng, scale):
    """A function adding multiplicative log-normal jitter to a base time."""
    return lambda base: base * float(rng.lognormal(0.0, scale))
