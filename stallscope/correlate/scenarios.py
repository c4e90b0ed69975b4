"""Synthetic scenarios with known answers: one per cause, healthy and compute-bound runs,
a collective wait behind a straggler, and decoys (a high-but-flat signal that does not
move with the stalls). ``python -m stallscope.correlate.evaluate --write-synthetic``
stores them in tests/data/traces/ beside the recorded runs.

Faults come in episodes (EPISODE_ON seconds of every EPISODE_EVERY) so that a cause's
signal can be seen to move with the stalls; exporter signals are sampled every 2 s and
the simulated GPU every 0.1 s, as in the agent; ``workers_cpu_ratio`` sums over the
workers, as the workers exporter records it.
"""
import numpy as np

from . import synth

DURATION = 120.0
EPISODE_EVERY, EPISODE_ON = 30.0, 10.0
T0 = 1000.0  # seconds on the monotonic clock where every synthetic run starts


def episode(t):
    return ((t - T0) % EPISODE_EVERY) >= (EPISODE_EVERY - EPISODE_ON)


def _run(seed, workers, load, compute, n=None, collective=None, extra=None):
    rng = np.random.default_rng(seed)
    j = synth.jitter(rng, 0.08)
    n = n or int(DURATION / 0.1)
    ev, ph = synth.simulate(
        n, workers, lambda k, t: j(load(k, t)), lambda k, t: j(compute(k, t)),
        t0=int(T0 * synth.SEC), collective=collective, extra=extra)
    end = int((T0 + DURATION) * synth.SEC)
    ev = [e for e in ev if e[0] <= end]
    ph = [p for p in ph if p[1] <= end]
    start, stop = synth.span_of(ev)
    return ev, synth.gpu_samples(ph, start, stop), (start, stop)


def _signals(span, **fns):
    return {name: synth.sampled(fn, span[0], span[1]) for name, fn in fns.items()}


def _episodic(base, during):
    return lambda t: during if episode(t) else base


def _slow_in_episodes(base, factor):
    return lambda k, t: base * (factor if episode(t) else 1.0)


def build():
    """[(name, labels, timeline body, [peer bodies])]."""
    out = []

    def add(name, verdict, cause, note, ev, gpu, span, workers, rank=0, signals=None,
            node_signals=None, peers=()):
        body = synth.body(ev, rank=rank, job="syn-" + name, workers=workers,
                          signals=_signals(span, **(signals or {})),
                          node_signals=_signals(span, **(node_signals or {})), gpu=gpu)
        labels = {"scenario": "syn-" + name, "expected_verdict": verdict, "expected_cause": cause,
                  "source": "synthetic", "note": note}
        out.append((name, labels, body, list(peers)))

    ev, gpu, span = _run(1, 4, lambda k, t: 0.2, lambda k, t: 0.1)
    add("healthy", "healthy", None, "4 workers at 0.2 s per batch vs 0.1 s compute.", ev, gpu, span,
        4, signals={"cfs_throttled_ratio": lambda t: 0.01, "workers_cpu_ratio": lambda t: 2.0},
        node_signals={"psi_io_some_ratio": lambda t: 0.05})
    ev, gpu, span = _run(2, 2, lambda k, t: 0.1, lambda k, t: 0.3)
    add("compute_bound", "healthy", None, "Compute 0.3 s per batch, loader 0.05 s.", ev, gpu, span, 2,
        signals={"workers_cpu_ratio": lambda t: 0.4})
    ev, gpu, span = _run(3, 4, lambda k, t: 0.6, lambda k, t: 0.1)
    add("too_few_workers", "input_bound", "too_few_workers",
        "4 workers at 0.6 s per batch: one batch every 0.15 s vs 0.1 s compute.", ev, gpu, span, 4,
        signals={"batch_load_seconds": lambda t: 0.6, "workers_cpu_ratio": lambda t: 3.8,
                 "cfs_throttled_ratio": lambda t: 0.0})
    ev, gpu, span = _run(4, 8, _slow_in_episodes(0.3, 6.0), lambda k, t: 0.1)
    add("cpu_throttle", "input_bound", "cpu_throttle",
        "Throttled workers in episodes; a flat-high io pressure is a decoy.", ev, gpu, span, 8,
        signals={"cfs_throttled_ratio": _episodic(0.02, 0.7), "workers_cpu_ratio": _episodic(7.2, 1.6)},
        node_signals={"psi_io_some_ratio": lambda t: 0.35})
    ev, gpu, span = _run(5, 4, lambda k, t: 1.2, lambda k, t: 0.1)
    add("cpu_throttle_continuous", "input_bound", "cpu_throttle",
        "Workers throttled all the time: stalls on every round, no quiet period.", ev, gpu, span, 4,
        signals={"cfs_throttled_ratio": lambda t: 0.6, "workers_cpu_ratio": lambda t: 0.4,
                 "batch_load_seconds": lambda t: 1.2})
    ev, gpu, span = _run(6, 4, _slow_in_episodes(0.2, 8.0), lambda k, t: 0.1)
    add("storage_latency", "input_bound", "storage_latency", "Slow shard reads in episodes.",
        ev, gpu, span, 4, signals={"shard_read_seconds": _episodic(0.01, 0.4),
                                   "workers_cpu_ratio": _episodic(2.4, 0.4)})
    stuck = lambda k, t: 2.0 if episode(t) and k % 10 == 0 else 0.0  # noqa: E731
    ev, gpu, span = _run(7, 4, lambda k, t: 0.2, lambda k, t: 0.1, extra=stuck)
    add("fuse_unhealthy", "input_bound", "fuse_unhealthy", "FUSE daemon stopped in episodes.",
        ev, gpu, span, 4, signals={"fuse_up": _episodic(1.0, 0.0),
                                   "fuse_probe_seconds": _episodic(0.002, 2.0)})
    ev, gpu, span = _run(8, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1)
    add("shm_exhaustion", "input_bound", "shm_exhaustion", "/dev/shm near full in episodes.",
        ev, gpu, span, 4, signals={"shm_used_ratio": _episodic(0.4, 0.97)})
    ev, gpu, span = _run(9, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1)
    add("io_pressure", "input_bound", "io_pressure", "Pod I/O pressure in episodes.", ev, gpu,
        span, 4, signals={"psi_io_some_ratio": _episodic(0.02, 0.6)},
        node_signals={"psi_io_some_ratio": _episodic(0.05, 0.5)})
    ev, gpu, span = _run(10, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1)
    add("memory_pressure", "input_bound", "memory_pressure", "Memory pressure in episodes.",
        ev, gpu, span, 4, signals={"psi_memory_some_ratio": _episodic(0.0, 0.4)})
    ev, gpu, span = _run(11, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1)
    add("cache_miss", "input_bound", "cache_miss", "Cold cache in episodes (misses go remote).",
        ev, gpu, span, 4, signals={"cache_miss_ratio": _episodic(0.05, 0.9),
                                   "shard_read_seconds": _episodic(0.01, 0.03)})
    burst = lambda t: ((t - T0) % 40.0) >= 36.0  # noqa: E731
    ev, gpu, span = _run(12, 4, lambda k, t: 0.2 * (8.0 if burst(t) else 1.0), lambda k, t: 0.1)
    add("checkpoint_contention", "input_bound", "checkpoint_contention",
        "A 4 s checkpoint write burst every 40 s slows the loader's reads.", ev, gpu, span, 4,
        node_signals={"disk_write_bytes_rate": lambda t: 4e8 if burst(t) else 2e6})
    ev, gpu, span = _run(13, 4, _slow_in_episodes(0.2, 6.0), lambda k, t: 0.1)
    add("unexplained", "input_bound", "unexplained",
        "Stalls in episodes that no recorded signal follows; flat-high decoys.", ev, gpu, span, 4,
        signals={"cfs_throttled_ratio": lambda t: 0.3, "shm_used_ratio": lambda t: 0.5},
        node_signals={"psi_io_some_ratio": lambda t: 0.45})
    # A straggler (rank 0, slow loader) and a rank (1) that waits for it in a collective.
    ev0, gpu0, span0 = _run(14, 2, lambda k, t: 0.5, lambda k, t: 0.1)
    step = np.median(np.diff([e[0] for e in ev0])) / synth.SEC
    ev1, gpu1, span1 = _run(15, 4, lambda k, t: 0.1, lambda k, t: 0.1,
                            collective=lambda k, t: max(0.0, step - 0.1))
    straggler = synth.body(ev0, rank=0, job="syn-collective_wait", workers=2, gpu=gpu0)
    add("collective_wait", "not_input_bound", None,
        "Rank 1's loader keeps up; its GPU idles in a collective waiting for rank 0.",
        ev1, gpu1, span1, 4, rank=1, peers=[straggler])
    return out
