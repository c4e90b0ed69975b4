"""The lab's stall scenarios, each with its known answer.

Every scenario runs the same small job (lab/trainer.py): N ranks in lockstep through a
gloo all_reduce per step, each with a 2-worker DataLoader reading 8 samples per batch
from local shard files, 150 ms of simulated GPU compute per step. On that healthy base
(per worker ~20 ms a batch, so the loader keeps far ahead; a prefetched batch still
costs 1-2 ms of IPC on a busy 2-core machine, about 1% of a step, under the 2% alert
line) each scenario breaks the last rank's input pipeline in one way. The expected answer
names the cause (stallscope/vocabulary/causes.py), the rank, and the alerts that must fire with the lab's short-window rules.
"""
import dataclasses

from . import faults

BASE = {
    "workers": 2, "batch_size": 8, "prefetch_factor": 2, "compute_s": 0.15,
    "sample_sleep_s": 0.002, "sample_cpu_s": 0.0, "sample_bytes": 4096,
}
SHARDS = {"kind": "files", "shards": 8, "read_bytes": 65536, "shard_bytes": 4 << 20}
DATA_WAIT_ALERTS = ("StallscopeDataWaitHigh",)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    fault: object = faults.NoFault            # factory of a Fault
    everyone: dict = dataclasses.field(default_factory=dict)  # plan changes for all ranks
    target: dict = dataclasses.field(default_factory=dict)    # ... for the target rank only
    cause: str = None                        # expected top cause (None: no stall)
    verdict: str = "input_bound"             # expected verdict for the target rank
    alerts: tuple = ()                       # alerts that must fire
    may_fire: tuple = ()                     # alerts that may, as true consequences of the fault
    duration: float = 25.0

    @property
    def stalls(self):
        return self.cause is not None

    def make_fault(self):
        return self.fault()


SCENARIOS = (
    Scenario("healthy", "No stall: the loader keeps ahead of compute on every rank.",
             verdict="healthy"),
    Scenario("compute-bound", "Slow compute (400 ms a step), fast loader: the GPU is the "
             "bottleneck, not the input pipeline.", everyone={"compute_s": 0.4}, verdict="healthy"),
    Scenario("too-few-workers", "One rank's per-sample work takes 60 ms: each of its 2 workers "
             "needs 480 ms a batch, so T_load / W = 240 ms > T_compute = 150 ms; it stalls "
             "every 2 batches and holds every rank back.",
             target={"sample_sleep_s": 0.06}, cause="too_few_workers", alerts=DATA_WAIT_ALERTS),
    Scenario("cpu-throttle", "One rank's loader workers need 6 ms of CPU per sample (0.32 CPU "
             "at the job's pace) but run in a cgroup with a 0.2-CPU CFS quota.",
             fault=lambda: faults.CpuQuota(0.2),
             target={"sample_cpu_s": 0.006, "sample_sleep_s": 0.0}, cause="cpu_throttle",
             alerts=DATA_WAIT_ALERTS + ("StallscopeCPUThrottled",)),
    Scenario("slow-storage", "One rank reads its shards through a FUSE mount that adds "
             "10 ms to every operation and 1 s to every 100th read (an object store's tail "
             "latency).", fault=faults.SlowFuse,
             cause="storage_latency", alerts=DATA_WAIT_ALERTS + ("StallscopeShardReadSlow",),
             # Buffered reads from FUSE wait for the page in io_schedule(), which PSI counts
             # as I/O stall of the rank's cgroup: a true, less specific, consequence.
             may_fire=("StallscopeIOPressure",)),
    Scenario("dead-fuse", "The FUSE daemon under one rank's shards is killed mid-run: every "
             "read fails with ENOTCONN; the loader retries, then skips the sample.",
             fault=faults.DeadFuse, cause="fuse_unhealthy",
             alerts=DATA_WAIT_ALERTS + ("StallscopeFuseMountDown",)),
    Scenario("shm-exhaustion", "One rank's /dev/shm (its own mount namespace) is 16 MiB with "
             "14 MiB held by leftovers: its workers fail to place 768 KiB batches in shared "
             "memory (\"unable to allocate shared memory(shm)\") and retry.", fault=faults.TinyShm, cause="shm_exhaustion",
             alerts=DATA_WAIT_ALERTS + ("StallscopeShmNearlyFull",)),
    Scenario("checkpoint-burst", "Every 6 s a 512 MiB checkpoint is uploaded over 8 streams to "
             "the storage server (200 MB/s shared, written through to its disk) that one rank "
             "reads its samples from (4 reads of 256 KiB each): while it lasts the rank's reads "
             "get a tenth of the bandwidth.",
             fault=faults.CheckpointBurst, cause="checkpoint_contention", alerts=DATA_WAIT_ALERTS),
    Scenario("cold-cache-straggler", "Every rank reads its shards in sequence through a local "
             "cache in front of a 30 ms object store, with one loader worker (plenty while the "
             "cache hits); one rank's cache holds only every 3rd shard and cannot fill, so it "
             "reads 5 of every 8 shards from the slow tier.", fault=faults.ColdCache,
             everyone={"workers": 1}, cause="cache_miss",
             alerts=DATA_WAIT_ALERTS + ("StallscopeCacheHitRateLow",)),
)
BY_NAME = {s.name: s for s in SCENARIOS}
DEMO = "too-few-workers"


def get(name):
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError("no scenario %r; known: %s" % (name, ", ".join(BY_NAME)))
