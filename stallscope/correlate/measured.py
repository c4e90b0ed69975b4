"""The numbers the predictions need (predict.Measured), taken from one rank's trace:
per-batch compute and load samples (their spread, not only their means), the loader's
settings, the workers' CPU use, the CFS quota and how long it held them back, their
run-queue wait, shard reads, /dev/shm and the iterators' first batches."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..report import UNREPORTED
from ..vocabulary import signal
from . import budget, slow_worker
from .context import Context
from .facts import NONE, RankFacts
from .predict import Measured
from .queue import Link

BATCH_LOAD = signal("batch_load_seconds").name
WORKERS_CPU = signal("workers_cpu_ratio").name
SHARD_READ = signal("shard_read_seconds").name
SHM_USED = signal("shm_used_ratio").name
SHM_FREE = signal("shm_free_bytes").name
THROTTLED = signal("cfs_throttled_seconds_rate").name
HELD_BACK = signal("cfs_held_back_ratio").name
RUNQUEUE = signal("workers_runqueue_ratio").name
SHARD_BYTES = signal("shard_read_bytes").name
LOADER_BYTES = signal("loader_read_bytes_rate").name
BLOCK_BYTES = signal("loader_block_read_bytes_rate").name
LINK_RATIO = signal("link_receive_ratio").name
LINK_CAPACITY = signal("link_capacity_bytes_rate").name
LINK_BYTES = signal("link_receive_bytes_rate").name
NETWORK_SHARE = signal("loader_workers_network_ratio").name
MAIN_ON_CPU = signal("loader_main_on_cpu_ratio").name
NODE_IDLE = signal("node_cpu_idle_cores").name
# Workers blocked on sockets this share of their time read a part of their bytes the
# kernel's rchar does not count (a socket's recv(): proc(5), /proc/<pid>/io): the drawn
# bandwidth-bound runs read 4e-05 MB a batch by rchar for 1 MB over the link (issue 49)
SOCKET_READERS = 0.2


def _series(trace: Any, name: str, scopes: tuple[str, ...] = ("rank",)) -> Any:
    """The signal's samples over the trace's span, or None when there are none."""
    span = trace.span()
    _, s = trace.signal(name, scopes)
    if s is None or span is None:
        return None
    s = s.clip(*span)
    return s if len(s) else None


def _values(trace: Any, name: str, scopes: tuple[str, ...] = ("rank",)) -> np.ndarray | None:
    s = _series(trace, name, scopes)
    return None if s is None else s.v


def _times(trace: Any, name: str) -> np.ndarray | None:
    """When each of _values' samples was measured, in seconds."""
    s = _series(trace, name)
    return None if s is None else s.t / 1e9


def read_rate(trace: Any) -> tuple[float, str] | None:
    """(bytes a second the rank's loader read over the trace's span, where from): its
    shard reads' bytes (the adapters'), else its workers' read() bytes (/proc/<pid>/io,
    which a socket's recv() is not in); None when neither was measured."""
    span = trace.span()
    if span is None or span[1] <= span[0]:
        return None
    seconds = (span[1] - span[0]) / 1e9
    reads = _values(trace, SHARD_BYTES)
    if reads is not None and reads.sum() > 0:
        return float(reads.sum()) / seconds, "shard reads"
    network = _values(trace, NETWORK_SHARE)
    if network is not None and float(network.mean()) >= SOCKET_READERS:
        # their bytes come over sockets, which rchar misses: the node's busiest link's,
        # all of it taken as the rank's (at most what it got), or not known
        link_bytes = _values(trace, LINK_BYTES, ("node",))
        if link_bytes is None or float(link_bytes.mean()) <= 0:
            return None
        return (float(link_bytes.mean()),
                "the link's bytes, all taken as the rank's: its workers read over sockets, "
                "which /proc/<pid>/io does not count")
    rate = _values(trace, LOADER_BYTES)
    return (float(rate.mean()), "the workers' reads") if rate is not None else None


def link(trace: Any) -> Link | None:
    """The node's busiest link (its share of capacity and capacity over the span) and
    the rank's bytes, or None when either is not measured."""
    ratio, rate, span = _values(trace, LINK_RATIO, ("node",)), read_rate(trace), trace.span()
    if ratio is None or rate is None or span is None or not trace.n or rate[0] <= 0:
        return None
    capacity = _values(trace, LINK_CAPACITY, ("node",))
    per_batch = rate[0] * ((span[1] - span[0]) / 1e9) / trace.n
    return Link(float(ratio.mean()), float(capacity.mean()) if capacity is not None else None,
                rate[0], per_batch)


def idle_while_queued(trace: Any) -> float | None:
    """The node's idle CPUs while the rank's workers waited for a CPU: its idle cores at
    each run-queue sample, weighted by the wait (None: either not measured, or no wait)."""
    queued, idle = _series(trace, RUNQUEUE), _series(trace, NODE_IDLE, ("node",))
    if queued is None or idle is None or queued.v.sum() <= 0:
        return None
    at = np.interp(queued.t, idle.t, idle.v)
    return float((at * queued.v).sum() / queued.v.sum())


def main_cpu(trace: Any) -> float | None:
    """Cores the rank's training thread was measured on a CPU (the sampler's share of
    its time on a CPU), or None: the signal, else the sampler's split of the window
    (traces recorded before the signal)."""
    on = _values(trace, MAIN_ON_CPU)
    if on is not None:
        return float(on.mean())
    split = (getattr(trace, "loader_split", None) or {}).get("main") or {}
    share = split.get("on_cpu")
    return float(share) if isinstance(share, (int, float)) else None


def others_cpu(trace: Any, peers: Iterable[Any]) -> tuple[float | None, int]:
    """(cores the node's other ranks' loaders used: their workers and training threads,
    as measured; how many ranks that sums), (None, 0) without another rank measured.
    Every rank the agent sees is on its node."""
    total, ranks = 0.0, 0
    for p in peers:
        if p is trace:
            continue
        workers, main = _values(p, WORKERS_CPU), main_cpu(p)
        if workers is None and main is None:
            continue
        total += (float(workers.mean()) if workers is not None else 0.0) + (main or 0.0)
        ranks += 1
    return (total if ranks else None), ranks


def measure(ctx: Context, facts: RankFacts = NONE, peers: Iterable[Any] = ()) -> Measured | None:
    """predict.Measured for the context's trace, or None with too few steady batches.
    ``facts``: the rank's quota, cpuset, read limit and memory limit (the agent's), the
    capacities its predictions run into; ``peers``: the traces of the ranks on its node
    (it among them or not), whose CPU use is not the workers' to have."""
    trace, ib, steady = ctx.trace, ctx.loop, ctx.steady
    if steady.sum() < 5:
        return None
    interval = trace.interval[steady] / 1e9
    wait = trace.wait[steady] / 1e9
    compute = np.maximum(interval - wait, 0.0)
    loader = trace.loader or UNREPORTED
    load = _values(trace, BATCH_LOAD)
    cpu = _values(trace, WORKERS_CPU)
    reads = _values(trace, SHARD_READ)
    span = trace.span()
    seconds = (span[1] - span[0]) / 1e9 if span else 0.0
    used, free = _values(trace, SHM_USED, ("rank", "node")), _values(trace, SHM_FREE, ("rank", "node"))
    shm_size = shm_used = None
    if used is not None and free is not None and used[-1] < 1:
        shm_size = float(free[-1] / (1 - used[-1]))
        shm_used = float(shm_size * used.max())
    throttled, runqueue = _values(trace, THROTTLED), _values(trace, RUNQUEUE)
    held_back = _values(trace, HELD_BACK)
    block = _values(trace, BLOCK_BYTES)
    shards = loader.dataset_shards
    by_worker = slow_worker.per_worker(trace)
    others, others_ranks = others_cpu(ctx.whole, peers)
    # the node's idle CPUs while the loop waited: what more workers had to run on then
    idle = budget.during_waits(trace, NODE_IDLE, ctx.waits, ("node",))
    return Measured(worker_loads=tuple(by_worker[p] for p in sorted(by_worker)) if by_worker else None,
        step_seconds=float(interval.mean()), compute=compute, data_wait_ratio=ib.data_wait_ratio,
        load=load, load_times=_times(trace, BATCH_LOAD), workers=loader.num_workers,
        prefetch=loader.prefetch_factor,
        persistent=loader.persistent_workers, quota_cores=facts.quota_cores,
        quota_ranks=facts.quota_ranks, workers_cpu_cores=float(cpu.mean()) if cpu is not None else None,
        iterator_starts=ib.iterator_starts, iterator_start_wait_seconds=ib.iterator_start_wait_seconds,
        steady_wait_seconds=float(wait.mean()), waits=wait, batches=trace.n, window_seconds=seconds,
        shard_read_p99=float(np.quantile(reads, 0.99)) if reads is not None else None,
        shard_reads_per_second=(len(reads) / seconds) if reads is not None and seconds > 0 else None,
        shm_size_bytes=shm_size, shm_used_bytes=shm_used,
        throttled_seconds_rate=float(throttled.mean()) if throttled is not None else None,
        held_back_ratio=float(held_back.mean()) if held_back is not None else None,
        runqueue_ratio=float(runqueue.mean()) if runqueue is not None else None, memory=facts.memory,
        link=link(ctx.whole), cpus=facts.cpus, io_read_limit=facts.io_read_limit,
        block_read_bytes_per_second=float(block.mean()) if block is not None else None,
        dataset_shards=shards if isinstance(shards, int) and shards > 0 else None,
        main_cpu_cores=main_cpu(trace), others_cpu_cores=others, others_ranks=others_ranks,
        node_idle_cores=idle, idle_while_queued=idle_while_queued(trace))
