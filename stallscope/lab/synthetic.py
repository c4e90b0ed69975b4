"""The synthetic recipes of the lab's scenarios: one generator per scenario that has one
(lab/scenarios.py names it), producing the ``syn-<name>.json`` trace of the evaluation
set (``python -m stallscope.lab.evaluate --write-synthetic``).

They cover what one machine cannot inject for real (memory or I/O pressure of a pod,
throttling that comes and goes) and decoys: a signal that is high all along but does
not move with the stalls, which the correlator must not name.

Faults come in episodes (EPISODE_ON seconds of every EPISODE_EVERY) so that a cause's
signal can be seen to move with the stalls; exporter signals are sampled every 2 s and
the simulated GPU every 0.1 s, as in the agent; ``workers_cpu_ratio`` sums over the
workers, as the workers exporter records it. Each generator takes the trace's job name
and returns (note, timeline body, [peer bodies]); the seeds are fixed, so the stored
traces can be checked against their generator.
"""
import numpy as np

from . import synth

DURATION = 120.0
EPISODE_EVERY, EPISODE_ON = 30.0, 10.0
T0 = 1000.0  # seconds on the monotonic clock where every synthetic run starts


def episode(t):
    return ((t - T0) % EPISODE_EVERY) >= (EPISODE_EVERY - EPISODE_ON)


def _run(seed, workers, load, compute, n=None, collective=None, extra=None, transfer=None):
    rng = np.random.default_rng(seed)
    j = synth.jitter(rng, 0.08)
    n = n or int(DURATION / 0.1)
    ev, ph = synth.simulate(
        n, workers, lambda k, t: j(load(k, t)), lambda k, t: j(compute(k, t)),
        t0=int(T0 * synth.SEC), collective=collective, extra=extra,
        transfer=None if transfer is None else (lambda k, t: j(transfer(k, t))))
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


def _trace(job, note, run, workers, rank=0, signals=None, node_signals=None, peers=()):
    ev, gpu, span = run
    body = synth.body(ev, rank=rank, job=job, workers=workers,
                      signals=_signals(span, **(signals or {})),
                      node_signals=_signals(span, **(node_signals or {})), gpu=gpu)
    return note, body, list(peers)


def healthy(job):
    return _trace(job, "4 workers at 0.2 s per batch vs 0.1 s compute.",
                  _run(1, 4, lambda k, t: 0.2, lambda k, t: 0.1), 4,
                  signals={"cfs_throttled_ratio": lambda t: 0.01, "workers_cpu_ratio": lambda t: 2.0},
                  node_signals={"psi_io_some_ratio": lambda t: 0.05})


def compute_bound(job):
    return _trace(job, "Compute 0.3 s per batch, loader 0.05 s.",
                  _run(2, 2, lambda k, t: 0.1, lambda k, t: 0.3), 2,
                  signals={"workers_cpu_ratio": lambda t: 0.4})


def too_few_workers(job):
    return _trace(job, "4 workers at 0.6 s per batch: one batch every 0.15 s vs 0.1 s compute.",
                  _run(3, 4, lambda k, t: 0.6, lambda k, t: 0.1), 4,
                  signals={"batch_load_seconds": lambda t: 0.6, "workers_cpu_ratio": lambda t: 3.8,
                           "cfs_throttled_ratio": lambda t: 0.0})


def transfer_cost(job):
    return _trace(job, "4 workers at 0.2 s per batch keep far ahead of 0.1 s compute, but the "
                  "loop takes 12 ms to receive and unpickle each batch (the hook's split); "
                  "decoys: workers on their cores, throttling high all along.",
                  _run(16, 4, lambda k, t: 0.2, lambda k, t: 0.1, transfer=lambda k, t: 0.012), 4,
                  signals={"batch_load_seconds": lambda t: 0.2, "workers_cpu_ratio": lambda t: 3.6,
                           "cfs_throttled_ratio": lambda t: 0.3})


def cpu_throttle_episodes(job):
    return _trace(job, "Throttled workers in episodes; a flat-high io pressure is a decoy.",
                  _run(4, 8, _slow_in_episodes(0.3, 6.0), lambda k, t: 0.1), 8,
                  signals={"cfs_throttled_ratio": _episodic(0.02, 0.7),
                           "workers_cpu_ratio": _episodic(7.2, 1.6)},
                  node_signals={"psi_io_some_ratio": lambda t: 0.35})


def cpu_throttle(job):
    return _trace(job, "Workers throttled all the time: stalls on every round, no quiet period.",
                  _run(5, 4, lambda k, t: 1.2, lambda k, t: 0.1), 4,
                  signals={"cfs_throttled_ratio": lambda t: 0.6, "workers_cpu_ratio": lambda t: 0.4,
                           "batch_load_seconds": lambda t: 1.2})


def storage_latency(job):
    return _trace(job, "Slow shard reads in episodes.",
                  _run(6, 4, _slow_in_episodes(0.2, 8.0), lambda k, t: 0.1), 4,
                  signals={"shard_read_seconds": _episodic(0.01, 0.4),
                           "workers_cpu_ratio": _episodic(2.4, 0.4)})


def fuse_down(job):
    stuck = lambda k, t: 2.0 if episode(t) and k % 10 == 0 else 0.0  # noqa: E731
    return _trace(job, "FUSE daemon stopped in episodes.",
                  _run(7, 4, lambda k, t: 0.2, lambda k, t: 0.1, extra=stuck), 4,
                  signals={"fuse_up": _episodic(1.0, 0.0), "fuse_probe_seconds": _episodic(0.002, 2.0)})


def shm_full(job):
    return _trace(job, "/dev/shm near full in episodes.",
                  _run(8, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1), 4,
                  signals={"shm_used_ratio": _episodic(0.4, 0.97)})


def io_pressure(job):
    return _trace(job, "Pod I/O pressure in episodes.",
                  _run(9, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1), 4,
                  signals={"psi_io_some_ratio": _episodic(0.02, 0.6)},
                  node_signals={"psi_io_some_ratio": _episodic(0.05, 0.5)})


def memory_pressure(job):
    return _trace(job, "Memory pressure in episodes.",
                  _run(10, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1), 4,
                  signals={"psi_memory_some_ratio": _episodic(0.0, 0.4)})


def cache_miss(job):
    return _trace(job, "Cold cache in episodes (misses go remote).",
                  _run(11, 4, _slow_in_episodes(0.2, 5.0), lambda k, t: 0.1), 4,
                  signals={"cache_miss_ratio": _episodic(0.05, 0.9),
                           "shard_read_seconds": _episodic(0.01, 0.03)})


def checkpoint_burst(job):
    burst = lambda t: ((t - T0) % 40.0) >= 36.0  # noqa: E731
    return _trace(job, "A 4 s checkpoint write burst every 40 s slows the loader's reads.",
                  _run(12, 4, lambda k, t: 0.2 * (8.0 if burst(t) else 1.0), lambda k, t: 0.1), 4,
                  node_signals={"disk_write_bytes_rate": lambda t: 4e8 if burst(t) else 2e6})


def unexplained(job):
    return _trace(job, "Stalls in episodes that no recorded signal follows; flat-high decoys.",
                  _run(13, 4, _slow_in_episodes(0.2, 6.0), lambda k, t: 0.1), 4,
                  signals={"cfs_throttled_ratio": lambda t: 0.3, "shm_used_ratio": lambda t: 0.5},
                  node_signals={"psi_io_some_ratio": lambda t: 0.45})


def collective_wait(job):
    """A straggler (rank 0, slow loader) and the diagnosed rank (1) that waits for it in
    a collective."""
    ev0, gpu0, span0 = _run(14, 2, lambda k, t: 0.5, lambda k, t: 0.1)
    step = np.median(np.diff([e[0] for e in ev0])) / synth.SEC
    straggler = synth.body(ev0, rank=0, job=job, workers=2, gpu=gpu0)
    return _trace(job, "Rank 1's loader keeps up; its GPU idles in a collective waiting for rank 0.",
                  _run(15, 4, lambda k, t: 0.1, lambda k, t: 0.1,
                       collective=lambda k, t: max(0.0, step - 0.1)),
                  4, rank=1, peers=[straggler])
