"""Every scenario with a known answer, in one table: what breaks, what stallscope must
find, and how to produce it.

A scenario names the cause stallscope must rank first at the rank the fault is on (a
cause of the vocabulary; None when nothing stalls: verdict healthy), and is produced in
up to two ways:

- ``real``: ``stallscope lab run NAME`` runs the lab's job (lab/job.py: N ranks of
  lab/trainer.py in lockstep, a healthy base) with a real fault on its last rank, checks
  the diagnosis and the alerts that must fire with the lab's short-window rules, and
  with ``--record DIR`` saves ``lab-NAME.json`` for the evaluation set;
- ``synthetic``: a generator (lab/synthetic.py) of ``syn-NAME.json``, a simulated
  DataLoader with signal samples, for what one machine cannot inject for real (a pod's
  memory or I/O pressure, throttling that comes and goes) and for decoys.

``view`` says whose timeline a trace holds: the faulty rank's ("target"), or that of a
peer that waits for it in the collective ("peer": expected verdict not_input_bound, no
cause of its own). The live run judges the faulty rank either way, as on-call would get
there: ``stallscope diagnose`` on rank 0 names the straggler, then diagnoses it.
"""
import dataclasses
from typing import Callable, Optional

from .. import vocabulary
from . import faults, synthetic


def _cause(name):
    return vocabulary.cause(name).name  # a KeyError at import for a cause not in the vocabulary


def _alerts(*names):
    declared = set(vocabulary.cause_alerts()) | {c.runbook_alert for c in vocabulary.CAUSES}
    unknown = set(names) - declared
    if unknown:
        raise ValueError("alerts not declared in the vocabulary: %s" % sorted(unknown))
    return names


def _checks(*names):
    unknown = set(names) - {c.name for c in vocabulary.CHECKS}
    if unknown:
        raise ValueError("set-up checks not declared in the vocabulary: %s" % sorted(unknown))
    return names


WAIT = _alerts("StallscopeDataWaitHigh")
# A quota under one core on a GPU rank with 2 workers: wrong on its face at the first batch.
QUOTA_WARNS = _checks("workers_over_quota", "fractional_cpu_limit")


@dataclasses.dataclass(frozen=True)
class RealRun:
    """How ``stallscope lab run`` produces a scenario: the fault on the last rank, plan
    changes for every rank and for the target (lab/trainer.py's plan keys), the alerts
    that must fire and those that may (as true consequences of the fault), the set-up
    checks the target's set-up fails (``warns``: vocabulary/checks.py; every other rank's
    must pass them all; None: not judged, as after a fix), the number of ranks
    (``--ranks`` overrides it), the measured window (``--duration``) and, for a job across
    lab nodes (lab/nodes.py, issue 35), the node of each rank (``nodes``: its length is the
    number of ranks) and ``beside``: a scenario whose job runs on the same nodes at the same
    time, each of its ranks to be diagnosed as that scenario expects, on both paths."""
    fault: Callable[[], faults.Fault] = faults.NoFault
    everyone: dict = dataclasses.field(default_factory=dict)
    target: dict = dataclasses.field(default_factory=dict)
    alerts: tuple = ()
    may_fire: tuple = ()
    warns: tuple = ()
    duration: float = 25.0
    ranks: int = 2
    nodes: tuple = ()
    beside: Optional[str] = None

    def __post_init__(self):
        if self.nodes and len(self.nodes) != self.ranks:
            raise ValueError("nodes places %d ranks of %d" % (len(self.nodes), self.ranks))


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    cause: Optional[str] = None              # expected top cause at the faulty rank
    real: Optional[RealRun] = None
    synthetic: Optional[Callable] = None     # job name -> (note, timeline, peers)
    view: str = "target"

    def __post_init__(self):
        if self.view not in ("target", "peer"):
            raise ValueError("%s: view is 'target' or 'peer', not %r" % (self.name, self.view))
        if self.real is None and self.synthetic is None:
            raise ValueError("%s: neither a real run nor a synthetic generator" % self.name)

    @property
    def stalls(self):
        return self.cause is not None

    @property
    def verdict(self):
        """The verdict expected at the faulty rank."""
        return "input_bound" if self.stalls else "healthy"

    def trace_labels(self):
        """(expected verdict, expected cause) of the rank a trace holds."""
        if self.view == "peer":
            return "not_input_bound", None
        return self.verdict, self.cause

    def make_fault(self):
        return self.real.fault()


SCENARIOS = (
    Scenario("healthy", "No stall: the loader keeps ahead of compute on every rank.",
             real=RealRun(), synthetic=synthetic.healthy),
    Scenario("compute-bound", "Slow compute (400 ms a step), fast loader: the GPU is the "
             "bottleneck, not the input pipeline.",
             real=RealRun(everyone={"compute_s": 0.4}), synthetic=synthetic.compute_bound),
    Scenario("too-few-workers", "One rank's per-sample work takes 60 ms: each of its 2 workers "
             "needs 480 ms a batch, so T_load / W = 240 ms > T_compute = 150 ms; it stalls "
             "every 2 batches and holds every rank back.", _cause("too_few_workers"),
             real=RealRun(target={"sample_sleep_s": 0.06}, alerts=WAIT),
             synthetic=synthetic.too_few_workers),
    Scenario("straggler-across-nodes", "Three ranks, one on each of three lab nodes (each its own "
             "network, mounts and agent; gloo over veths): the rank on node-c has too-few-workers' "
             "60 ms a sample. Its victims' agents never hear from it: they are named victims "
             "through Prometheus, or with every node's agent.", _cause("too_few_workers"),
             real=RealRun(target={"sample_sleep_s": 0.06}, alerts=WAIT, ranks=3,
                          nodes=("node-a", "node-b", "node-c"))),
    Scenario("two-jobs-nodes", "Two jobs share two lab nodes: one is too-few-workers' job, its "
             "straggler on node-b; beside it the healthy scenario's job, a rank on each node, "
             "which must be diagnosed healthy on both paths while the other starves.",
             _cause("too_few_workers"),
             real=RealRun(target={"sample_sleep_s": 0.06}, alerts=WAIT, nodes=("node-a", "node-b"),
                          beside="healthy")),
    Scenario("too-few-workers-3", "One rank has 3 workers and 90 ms of work per sample: 720 ms "
             "a batch per worker, T_load / W = 240 ms > T_compute = 150 ms; a round of 3 batches "
             "arrives together, so it stalls every 3 batches.", _cause("too_few_workers"),
             real=RealRun(target={"workers": 3, "sample_sleep_s": 0.09}, alerts=WAIT)),
    Scenario("margin", "One rank's loader almost keeps up: each of its 2 workers delivers at most "
             "one sample every 39 ms (a stream with a per-connection rate cap), so a batch comes "
             "every 156 ms against a 150 ms step (its CPU work overlapping the simulated GPU's, on "
             "every rank): the rank waits ~3.5% of its step time, just over the 2% line; the "
             "headline alert fires and the verdict must be input_bound, never healthy.",
             _cause("too_few_workers"),
             real=RealRun(everyone={"compute_overlaps_cpu": True},
                          target={"sample_pace_s": 0.039, "sample_sleep_s": 0.0}, alerts=WAIT)),
    # 48 tensors a sample waited 8.8-10.6 % at load 26-49 but 2.1-2.4 % on a quiet machine
    # (6.4 ms a batch, ~130 us a tensor: CI, under the 5 % its e2e test asks of a stall)
    Scenario("transfer-cost", "One rank's samples are 256 tensors each, made at no cost: its 2 "
             "workers keep far ahead, but every batch is 256 shared-memory tensors the training "
             "process takes over one file descriptor at a time, tens of ms a batch against 300 ms "
             "of compute (every rank's, so that one tensor a batch stays far under the line on "
             "the others while this rank loads the machine). More workers would not help.",
             _cause("transfer_cost"),
             real=RealRun(everyone={"compute_s": 0.3},
                          target={"tensors_per_sample": 256, "sample_sleep_s": 0.0,
                                  "sharing_strategy": "file_descriptor"}, alerts=WAIT),
             synthetic=synthetic.transfer_cost),
    Scenario("straggler-peer", "One rank's loader is too slow (60 ms a sample, 2 workers); the "
             "trace is its peer's, whose loader keeps up and whose step waits in the all_reduce "
             "for the straggler: not input-bound.", _cause("too_few_workers"), view="peer",
             real=RealRun(target={"sample_sleep_s": 0.06}, alerts=WAIT),
             synthetic=synthetic.collective_wait),
    Scenario("victims", "4 ranks; the last reads every sample from an object store endpoint (no "
             "local copy, no cache) that answers in 5 ms, and in 100 ms during 5 s brownouts every "
             "12 s, when its 2 workers deliver a batch every ~410 ms against a 150 ms step. The others "
             "wait for it in the all_reduce, and a little on their own loaders (each batch's "
             "transfer into the main process). The trace is rank 0's: a victim, not input-bound, "
             "naming rank 3.", _cause("storage_latency"), view="peer",
             real=RealRun(fault=faults.RemoteShards, ranks=4, alerts=WAIT)),
    # victims' own loaders stay under the line in `victims` (1.5-1.8 % recorded); here they
    # are over it on their own (issue 16, item 3), so only the straggler rule can tell them
    # apart. A victim's ratio is its own per-batch cost over the job's step, which the
    # straggler stretches; the straggler's wait must stay several times larger on a busy
    # machine. So the victims' extra cost is a fixed wait (16 tensors a sample instead grew
    # with the machine's load until the victims waited within 3x of the straggler), and
    # the straggler's brownouts are long and slow enough that its loop waits through
    # nearly all of each (with 100 ms reads the loop got a batch every 400 ms and the slow
    # reads between them counted against storage_latency as quiet time).
    Scenario("victims-over-line", "4 ranks; the last reads every sample from an object store "
             "endpoint that answers in 5 ms, and in 300 ms during 4 s brownouts every 8 s, when its "
             "2 workers deliver a batch every ~1.2 s against a 150 ms step. The three others' "
             "batches each carry a record that takes 8 ms to unpickle in the training process (the "
             "straggler's none): with the transfer's own cost they wait ~3-9% of their steps on "
             "their own loaders, over the 2% line, yet a fraction of what the straggler waits on "
             "its storage (~40%). The trace is rank 0's: a victim, not input-bound, naming rank 3.",
             _cause("storage_latency"), view="peer",
             real=RealRun(fault=lambda: faults.RemoteShards(every=8.0, slow_for=4.0, slow_latency=0.3),
                          ranks=4, everyone={"batch_unpickle_s": 0.008},
                          target={"batch_unpickle_s": 0.0}, alerts=WAIT,
                          # the straggler's reads are slow: true, and the rank's own
                          may_fire=_alerts("StallscopeShardReadSlow"))),
    Scenario("cpu-throttle", "One rank's loader workers need 6 ms of CPU per sample (0.32 CPU "
             "at the job's pace) but run in a cgroup with a 0.2-CPU CFS quota.", _cause("cpu_throttle"),
             real=RealRun(fault=lambda: faults.CpuQuota(0.2),
                          target={"sample_cpu_s": 0.006, "sample_sleep_s": 0.0},
                          alerts=WAIT + _alerts("StallscopeCPUThrottled"), warns=QUOTA_WARNS),
             synthetic=synthetic.cpu_throttle),
    # issue 30: the consumer throttled, not the loader. Its set-up checks are not judged:
    # the quota comes after the first batch, when they are.
    Scenario("trainer-throttled", "One rank's training process runs under a 0.03-CPU CFS quota "
             "from its first batch on, its 2 loader workers (forked before) outside it. The workers "
             "make samples at almost no cost and sit idle with batches ready; the training process "
             "spends 2 ms of CPU taking each batch over (a per-batch record to unpickle) besides its "
             "step's own CPU work, so its quota runs out in its loop, which waits throttled inside "
             "next(). The consumer is held back, not the loader: the trainer container's CPU limit "
             "is the fix, and more workers would not help.", _cause("cpu_throttle"),
             real=RealRun(fault=lambda: faults.CpuQuota(0.03, trainer=True),
                          target={"batch_unpickle_cpu_s": 0.002, "sample_sleep_s": 0.0},
                          alerts=WAIT + _alerts("StallscopeCPUThrottled"), warns=None)),
    # issue 17: scenarios where the obvious fix is wrong or capped
    Scenario("quota-capped", "One rank's 2 loader workers need 10 ms of CPU per sample (80 ms a "
             "batch: 0.53 CPU at the job's pace) in a cgroup with a 0.4-CPU CFS quota: the loader "
             "delivers a batch every 200 ms at best against 150 ms of compute, so more workers only "
             "share the same throttled CPU; the fix is the CPU limit.", _cause("cpu_throttle"),
             real=RealRun(fault=lambda: faults.CpuQuota(0.4),
                          target={"sample_cpu_s": 0.01, "sample_sleep_s": 0.0},
                          alerts=WAIT, may_fire=_alerts("StallscopeCPUThrottled"), warns=QUOTA_WARNS)),
    Scenario("variable-cost", "One rank's per-sample cost varies widely: one batch in 4, at "
             "random, takes 120 ms a sample (960 ms), the others 15 ms (120 ms); its 2 workers "
             "deliver one batch per 165 ms on the mean, against 150 ms of compute plus the step's "
             "overhead, which looks nearly enough (and 3 workers plenty), but the loop takes batches "
             "in order and waits behind each costly one.", _cause("too_few_workers"),
             real=RealRun(target={"sample_sleep_s": 0.015, "heavy_batch_every": 4,
                                  "heavy_sleep_s": 0.12}, alerts=WAIT)),
    # issue 18: inside the loader
    Scenario("slow-worker", "One rank has 4 loader workers, and worker 2 takes 100 ms more per "
             "sample than the others (816 ms a batch against 16 ms): the loader hands batches out "
             "in turn and delivers them in order, so every 4th batch waits for that worker while "
             "the others' batches are ready; a batch every ~204 ms against 150 ms of compute. "
             "in_order=False would let the fast workers carry the load.", _cause("slow_worker"),
             real=RealRun(target={"workers": 4, "slow_worker_id": 2, "slow_worker_sleep_s": 0.1},
                          alerts=WAIT)),
    Scenario("epoch-start", "One rank's epochs are 20 batches and its 2 loader workers are not "
             "persistent: every epoch forks them again and each spends 1.5 s starting up (an index "
             "built in worker_init_fn) before its first batch. The steady state keeps up; ~1.5 s "
             "of every ~4.5 s epoch waits at its start.", _cause("epoch_start"),
             real=RealRun(target={"epoch_batches": 20, "persistent_workers": False,
                                  "worker_start_s": 1.5}, alerts=WAIT)),
    # issue 32: set-ups wrong on their face, warned at the first batch (or, for epochs, the
    # second iterator start) before any stall is judged
    Scenario("default-loader", "One rank builds its DataLoader with torch's defaults "
             "(num_workers=0, pin_memory=False) on a GPU: the training process reads and decodes "
             "every sample itself (8 x 20 ms a batch) while the GPU idles, ~160 ms a batch against "
             "150 ms of compute.", _cause("too_few_workers"),
             real=RealRun(target={"workers": 0, "pin_memory": False, "sample_sleep_s": 0.02},
                          alerts=WAIT, warns=_checks("no_workers_with_gpu", "pin_memory_off_with_gpu"))),
    Scenario("epoch-restart", "One rank's epochs are 4 batches (a small dataset, a validation "
             "loop) and its 2 loader workers are not persistent: each epoch forks them again, and "
             "each spends 1 s starting up before its first batch, longer than the ~0.6 s the epoch "
             "then runs.", _cause("epoch_start"),
             real=RealRun(target={"epoch_batches": 4, "persistent_workers": False,
                                  "worker_start_s": 1.0},
                          alerts=WAIT, warns=_checks("workers_restart_each_epoch"))),
    # issue 18: loader workers killed by the kernel; the rank restarts its loader and goes on
    Scenario("shm-bus-error", "One rank's /dev/shm (its own mount namespace) is 128 MiB, 112 MiB of "
             "it held by a crashed run's leftovers, and its 2 loader workers keep every sample (64 "
             "KiB) in a /dev/shm mapping that is not fallocate'd: every few seconds one fills the "
             "tmpfs and dies of SIGBUS (\"DataLoader worker (pid N) is killed by signal: Bus "
             "error\"); the rank restarts its loader, whose workers take 2 x 0.5 s to start.",
             _cause("shm_exhaustion"),
             real=RealRun(fault=faults.ShmBusError, target={"worker_start_s": 0.5},
                          alerts=WAIT + _alerts("StallscopeLoaderWorkerKilled"),
                          # the leftovers keep /dev/shm near the line all along
                          may_fire=_alerts("StallscopeShmNearlyFull"))),
    Scenario("oom-kill", "One rank runs under a 768 MiB memory limit (its pod's memory cgroup) and "
             "its 2 loader workers keep every sample in their heap (2 MiB each, as an unbounded cache "
             "does): every few seconds one is OOM-killed at the limit (\"DataLoader worker (pid N) "
             "is killed by signal: Killed\"); the rank restarts its loader, whose workers take 2 x "
             "0.5 s to start.", _cause("memory_limit"),
             real=RealRun(fault=faults.MemoryLimit, target={"worker_start_s": 0.5},
                          alerts=WAIT + _alerts("StallscopeLoaderWorkerKilled"),
                          # reclaim at the limit stalls the pod's tasks on memory
                          may_fire=_alerts("StallscopeMemoryPressure"))),
    Scenario("cpu-throttle-episodes", "Throttling that comes and goes, with a decoy: I/O "
             "pressure high all along, not moving with the stalls.", _cause("cpu_throttle"),
             synthetic=synthetic.cpu_throttle_episodes),
    # issue 30: a CPU-bound loader on a node without spare CPU
    Scenario("collate-saturated", "One rank's 4 loader workers spend 40 ms of CPU a sample (320 ms "
             "a batch, in a CPU-heavy collate and transforms) on this 2-core node, no quota: they "
             "hold every core, and the training process gets a CPU to take each batch over only "
             "between them. More workers would take more of the same cores.", _cause("cpu_contention"),
             real=RealRun(target={"workers": 4, "sample_cpu_s": 0.04, "sample_sleep_s": 0.0}, alerts=WAIT)),
    Scenario("cpu-crowded", "One rank's loader workers need 10 ms of CPU per sample (80 ms a "
             "batch: 0.53 CPU at the job's pace) on a CPU they share with 3 busy processes; no "
             "quota anywhere: the workers are runnable, not running.", _cause("cpu_contention"),
             real=RealRun(fault=lambda: faults.CpuHogs(3),
                          target={"sample_cpu_s": 0.01, "sample_sleep_s": 0.0}, alerts=WAIT)),
    Scenario("cpu-crowded-quota", "One rank's loader workers need 12 ms of CPU per sample (0.62 CPU "
             "at the job's pace) on a CPU they share with 2 busy processes, inside a cgroup with a "
             "generous 2-CPU CFS quota that never throttles them (on one CPU they cannot use it "
             "up): crowded, not throttled; a larger limit would buy nothing.", _cause("cpu_contention"),
             real=RealRun(fault=lambda: faults.Combined(faults.CpuQuota(2.0), faults.CpuHogs(2)),
                          target={"sample_cpu_s": 0.012, "sample_sleep_s": 0.0}, alerts=WAIT)),
    Scenario("slow-storage", "One rank reads its shards through a FUSE mount that adds 10 ms to "
             "every operation and 1 s to every 100th read (an object store's tail latency).",
             _cause("storage_latency"),
             real=RealRun(fault=faults.SlowFuse, alerts=WAIT + _alerts("StallscopeShardReadSlow"),
                          # Buffered reads from FUSE wait for the page in io_schedule(), which
                          # PSI counts as I/O stall of the rank's cgroup: a true, less
                          # specific, consequence.
                          may_fire=_alerts("StallscopeIOPressure")),
             synthetic=synthetic.storage_latency),
    Scenario("brownout-busy-node", "One rank reads its shards through a FUSE mount whose backend "
             "browns out (40 ms per operation for 5 s every 12 s, 0.5 ms otherwise), while a process "
             "outside the pods writes 40 MB/s to the node's disk all along: the node shows I/O "
             "pressure, and the rank's pod stalls on I/O as its reads wait; the cause is the rank's "
             "own mount, not the node.", _cause("storage_latency"),
             real=RealRun(fault=lambda: faults.Combined(
                 faults.SlowFuse(0.0005, tail_every=0, brownouts=(12.0, 5.0, 0.04)), faults.NodeWriter(40.0)),
                 alerts=WAIT,
                 # Buffered FUSE reads wait in io_schedule(): the pod's PSI shows I/O stall.
                 may_fire=_alerts("StallscopeIOPressure", "StallscopeShardReadSlow"))),
    Scenario("dead-fuse", "The FUSE daemon under one rank's shards is killed mid-run: every read "
             "fails with ENOTCONN; the loader retries, then skips the sample.", _cause("fuse_unhealthy"),
             real=RealRun(fault=faults.DeadFuse, alerts=WAIT + _alerts("StallscopeFuseMountDown")),
             synthetic=synthetic.fuse_down),
    # issue 30: the same slow mount read with plain open()/read(), no adapter: no read
    # latency is reported, so only what the workers are measured to be doing (blocked in
    # the mount's reads: the loader-state sampler) can name the storage.
    Scenario("slow-storage-plain", "One rank reads its shards through a FUSE mount that adds 20 ms "
             "to every operation, with plain open()/read() (only the two public lines in the "
             "trainer): each worker needs ~0.5 s a batch against 150 ms of compute, blocked in the "
             "mount's reads.", _cause("storage_latency"),
             real=RealRun(fault=lambda: faults.SlowFuse(latency=0.02, tail_every=0, timed=False),
                          alerts=WAIT, may_fire=_alerts("StallscopeIOPressure"))),
    # issue 30, item 4: the node-wide cause lines up with the stalls, the rank's slow reads
    # are its symptom; read with plain open()/read() (nothing reported)
    Scenario("checkpoint-read-disk", "Every 12 s a 400 MiB checkpoint is written to the node's "
             "disk at 100 MB/s (a process outside the pods); one rank reads its shards with plain "
             "open()/read() through a FUSE mount whose backend shares that device: its reads take "
             "0.5 ms, and up to 40 ms more while the node's disks write (the daemon follows their "
             "measured write rate), so the rank stalls during each burst.",
             _cause("checkpoint_contention"),
             real=RealRun(fault=lambda: faults.Combined(
                 faults.SlowFuse(0.0005, tail_every=0, timed=False, contention=(0.04, 100e6)),
                 faults.DiskCheckpoints(400, 12.0, 100.0)),
                 alerts=WAIT, may_fire=_alerts("StallscopeIOPressure"))),
    Scenario("hang", "The FUSE daemon under one rank's shards stops answering (SIGSTOP) a third "
             "into the run: a worker's read waits in D state for good and the rank hangs in "
             "next(); the agent triages the hang (who is stuck where) and the stuck mount is the "
             "cause.", _cause("fuse_unhealthy"),
             real=RealRun(fault=faults.FrozenFuse, alerts=WAIT + _alerts("StallscopeFuseMountDown"),
                          # a frozen daemon's mount is also stuck; its readers wait in D
                          # state (the pod's I/O PSI); the job makes no progress
                          # (StallscopeJobNoProgress: the mixin's SLO alert, no cause's)
                          may_fire=_alerts("StallscopeFuseMountStuck", "StallscopeIOPressure")
                          + ("StallscopeJobNoProgress",))),
    Scenario("stuck-mount-node", "hang's frozen FUSE daemon on a lab node: two ranks on two nodes; "
             "the daemon under node-b's rank mounts in a namespace made inside node-b's, and stops "
             "answering a third into the run. The stuck mount is named on node-b, whose agent "
             "alone sees it; node-a's rank waits for it.", _cause("fuse_unhealthy"),
             real=RealRun(fault=faults.FrozenFuse, alerts=WAIT + _alerts("StallscopeFuseMountDown"),
                          may_fire=_alerts("StallscopeFuseMountStuck", "StallscopeIOPressure")
                          + ("StallscopeJobNoProgress",), nodes=("node-a", "node-b"))),
    Scenario("shm-exhaustion", "One rank's /dev/shm (its own mount namespace) is 16 MiB with 14 MiB "
             "held by leftovers: its workers fail to place 768 KiB batches in shared memory "
             "(\"unable to allocate shared memory(shm)\") and retry.", _cause("shm_exhaustion"),
             real=RealRun(fault=faults.TinyShm, alerts=WAIT + _alerts("StallscopeShmNearlyFull")),
             synthetic=synthetic.shm_full),
    Scenario("shm-full-node", "Two ranks on two lab nodes; node-b's own /dev/shm (its mount "
             "namespace, which its pods' copy) is 16 MiB with 14 MiB held by leftovers, as "
             "shm-exhaustion's pod has: a node-wide cause, named for node-b's rank only.",
             _cause("shm_exhaustion"), real=RealRun(
                 fault=lambda: faults.NodeShm(size_mib=16, leftover_mib=14),
                 alerts=WAIT + _alerts("StallscopeShmNearlyFull"), nodes=("node-a", "node-b"))),
    Scenario("checkpoint-burst", "Every 10 s a 512 MiB checkpoint is uploaded over 8 streams to the "
             "storage server (200 MB/s shared, written through to its disk) that one rank reads its "
             "samples from (4 reads of 256 KiB each): while it lasts the rank's reads get a tenth "
             "of the bandwidth.", _cause("checkpoint_contention"),
             real=RealRun(fault=faults.CheckpointBurst, alerts=WAIT),
             synthetic=synthetic.checkpoint_burst),
    # issue 31: the bytes/s math. The link, not the worker count, caps the loader: 2 MiB a
    # batch at 150 ms of compute is ~14 MB/s, and the link carries 6.
    Scenario("bandwidth-bound", "One rank reads every sample (256 KiB) from an object store in a "
             "network namespace of its own, behind a veth link that a tc token bucket shapes to "
             "6 MB/s: at the job's pace (8 samples a batch, 150 ms of compute) its loader needs "
             "~14 MB/s and its 2 workers get 6 between them; more workers share the same link.",
             _cause("bandwidth_bound"), real=RealRun(fault=faults.ShapedStore, alerts=WAIT)),
    # the bytes/s math must clear the link where a job needs a few kB/s: the same shaped
    # store, samples of 4 KiB (~220 kB/s at the job's pace, 4 % of the link), and workers
    # too slow for the compute
    Scenario("text-over-link", "One rank reads every sample (4 KiB, text-like) from the same "
             "object store behind a link shaped to 6 MB/s, which its loader needs 4 % of; its 2 "
             "workers take 60 ms a sample, too slow for the compute: the link is not the limit.",
             _cause("too_few_workers"), real=RealRun(
                 fault=lambda: faults.ShapedStore(read_kib=4), target={"sample_sleep_s": 0.06},
                 alerts=WAIT)),
    # "a 503-ing object-store prefix idles the whole fleet": the store answers 503 to 40 %
    # of GETs; the reader retries with backoff as the cloud SDKs do (lab/sources.py)
    Scenario("storage-errors", "One rank reads every sample (64 KiB) from an object store that "
             "answers 503 (slow down) to 40 % of its GETs; the reader retries each with "
             "exponential backoff from 50 ms, as the cloud SDKs do, and its 2 workers fall "
             "behind the compute. Nothing fails in the loop.",
             _cause("storage_errors"), real=RealRun(
                 fault=lambda: faults.ShapedStore(rate=50e6, read_kib=64, error_rate=0.4),
                 alerts=_alerts("StallscopeDataWaitHigh", "StallscopeStorageErrors"),
                 # the retried reads are slow: true, and the rank's own
                 may_fire=_alerts("StallscopeShardReadSlow"))),
    Scenario("cold-cache-straggler", "Every rank reads its shards in sequence through a local cache "
             "in front of a 30 ms object store, with one loader worker (plenty while the cache "
             "hits); one rank's cache holds only every 3rd shard and cannot fill, so it reads 5 of "
             "every 8 shards from the slow tier.", _cause("cache_miss"),
             real=RealRun(fault=faults.ColdCache, everyone={"workers": 1},
                          alerts=WAIT + _alerts("StallscopeCacheHitRateLow")),
             synthetic=synthetic.cache_miss),
    Scenario("io-pressure", "The pod's tasks stall on I/O in episodes (PSI).", _cause("io_pressure"),
             synthetic=synthetic.io_pressure),
    Scenario("memory-pressure", "The pod's tasks stall on memory in episodes (PSI).",
             _cause("memory_pressure"), synthetic=synthetic.memory_pressure),
    Scenario("unexplained", "Stalls in episodes that no recorded signal follows, beside signals "
             "high all along (decoys).", _cause("unexplained"), synthetic=synthetic.unexplained),
)
BY_NAME = {s.name: s for s in SCENARIOS}
REAL = tuple(s for s in SCENARIOS if s.real is not None)
SYNTHETIC = tuple(s for s in SCENARIOS if s.synthetic is not None)
DEMO = "too-few-workers"


def get(name):
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError("no scenario %r; known: %s" % (name, ", ".join(BY_NAME))) from None
