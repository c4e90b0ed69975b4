"""Verdicts, the lines they are drawn at, and the causes of a stall, each named by its
fix: the signals the correlator probes for it (co-occurrence lines), the alerts that
page on it, the runbook and the first thing to do.

One signal has one threshold. Where an alert's line on a signal differs from the
correlator's co-occurrence line on it, the alert says why, beside it.
"""
from .entries import Cause, CauseAlert, Line

VERDICTS = ("healthy", "input_bound", "not_input_bound", "unknown")
# The SLI line: a rank that waits on its own loader for this share of its step time is
# input-bound. The headline alert (StallscopeDataWaitHigh), the correlator's verdict,
# diagnose on both paths and the cause alerts' "waiting rank" gate all draw it here; it is
# also input goodput's error budget (the mixin's SLO target is 1 - it: 98 %).
DATA_WAIT_LINE = 0.02
# A straggler: its data-wait above this many times the job's median (and over the line).
STRAGGLER_FACTOR = 3.0
# A cause is named as the finding when its correlator score reaches this.
ATTRIBUTE = 0.5
# Fewer batches than this in a window: no verdict (the first batch's start-up dominates).
MIN_BATCHES = 20

_WAIT = ("StallscopeDataWaitHigh",)

CAUSES = (
    Cause("cpu_throttle", "The CFS quota throttled the rank", (
        Line("cfs_throttled_ratio", 0.1, scopes=("rank",)),
        Line("cfs_throttled_seconds_rate", 0.05, scopes=("rank",))),
        (CauseAlert(
            "StallscopeCPUThrottled", "cfs_throttled_ratio", ">", 0.25,
            "The CFS quota throttles a waiting rank's loader.",
            "Container {{ $labels.container }} of <where> was throttled in {{ $value | "
            "humanizePercentage }} of its CFS periods over the last <window> (threshold <line>).",
            why="The correlator counts a 2 s sample with 10 % throttled periods as active when it "
                "lines up with the stalls; a page needs a pod throttled in a quarter of its "
                "periods for the whole rate window, with a rank waiting."),),
        "StallscopeCPUThrottled",
        "Raise the pod's CPU limit so num_workers + 1 cores fit the quota, or lower num_workers "
        "and set torch.set_num_threads(1) in worker_init_fn.",
        advises=("cpu_limit_cores",),
        advice_otherwise="Lower num_workers and set torch.set_num_threads(1) in worker_init_fn: a "
                         "larger CPU limit is predicted not to help here."),
    # Not throttling: the workers wait in the run queue with no quota holding them back (or
    # one that did not throttle), because the node's cores are all busy. A larger limit
    # buys nothing; less CPU work per sample, fewer processes or more nodes do (issue 16).
    Cause("cpu_contention", "The node's CPUs were crowded (no quota throttled the rank)", (
        Line("workers_runqueue_ratio", 0.2, scopes=("rank",)),), (),
        "StallscopeDataWaitHigh",
        "Cut the CPU work per sample (pre-decode, decode on the GPU, torch.set_num_threads(1) in "
        "worker_init_fn), run fewer processes on the node (other pods, fewer workers than "
        "cores), or spread the job over more nodes; raising a CPU limit does not help."),
    Cause("too_few_workers", "The loader is too slow for the compute", (), (),
          "StallscopeDataWaitHigh",
          "Raise num_workers to the count the report gives (workers that wait off the CPU, on "
          "reads or sleeps, help past the core count; workers that compute, not past the CPU "
          "quota), or make per-sample work cheaper (pre-decode, decode on the GPU).", computed=True,
          advises=("num_workers",),
          advice_otherwise="Make per-sample work cheaper (pre-decode, decode on the GPU, "
                           "torch.set_num_threads(1) in worker_init_fn): more workers are predicted "
                           "not to help here."),
    # Measured by the hook (hook/transfer.py): the part of each wait that was not waiting
    # for a worker's batch to be ready. Its score is that part's share of the wait; the
    # line is where diagnose names it from Prometheus alone: most of the wait.
    Cause("transfer_cost", "Getting each batch from the workers into the training process "
          "(receive, unpickle, pin, the loader's bookkeeping) took most of the wait", (
              Line("transfer_wait_ratio", 0.5, scopes=("rank",)),), (),
          "StallscopeDataWaitHigh",
          # the fixes' measured effect (issue 30, item 5): benchmarks/bench_handoff.py, a real
          # DataLoader whose workers keep ahead, 256 tensors of a 4 KiB sample, 8 a batch, on
          # this project's 2-core machine: 66.7 ms a batch; file_system 15.6 ms (0.23x); one
          # tensor a sample 3.7 ms (0.06x); both 2.1 ms (0.03x)
          "Cut the per-batch transfer, which more workers, CPU quota or faster storage will not "
          "remove: fewer tensors per sample (pack them into one: a 20th of the handoff where "
          "samples were 256 small tensors), the file_system sharing strategy "
          "(torch.multiprocessing.set_sharing_strategy; a quarter of it there), larger batches "
          "per transfer, collate in the workers rather than in the main process, and "
          "pin_memory=True so a thread receives batches beside the loop (with an accelerator).",
          computed=True),
    # One worker slower than the others (issue 18): the DataLoader hands batches out in
    # turn and delivers them in order, so the loop waits for that worker's batch while
    # the others' are ready (correlate/slow_worker.py, from per-worker load times).
    Cause("slow_worker", "One loader worker is slower than the others and in-order delivery "
          "holds every batch behind its", (), (),
          "StallscopeDataWaitHigh",
          "Find why that worker is slow (its shard, its host's CPU, a sample that is costly to "
          "decode); pass in_order=False to the DataLoader (torch >= 2.6) so the loop takes "
          "the other workers' ready batches instead of waiting in line.", computed=True),
    Cause("epoch_start", "Each epoch waits for its loader workers to start", (), (),
          "StallscopeDataWaitHigh",
          "Set persistent_workers=True so workers survive across epochs; make worker start-up "
          "cheap (open files and build indexes lazily, not in Dataset.__init__ copied to every "
          "worker); keep prefetch_factor >= 2.", computed=True),
    Cause("storage_latency", "Shard reads were slow", (
        Line("shard_read_seconds", 0.05, scopes=("rank",)),
        Line("workers_dstate", 0.5, scopes=("rank",)),
        # What the workers are measured doing (the loader-state sampler, issue 30): blocked
        # in a read, open or page fault on a file for most of their time. It names slow
        # storage that no adapter reports (plain open()/read()), which a shard-read
        # latency cannot, and a D-state count misses when the reads wait interruptibly.
        Line("loader_workers_storage_ratio", 0.5, scopes=("rank",))),
        (CauseAlert(
            "StallscopeShardReadSlow", "shard_read_seconds", ">", 0.5,
            "Shard reads of a waiting rank are slow.",
            "The p99 latency of shard reads from tier {{ $labels.tier }} in <where> was {{ $value "
            "| humanizeDuration }} over the last <window> (threshold <line>).",
            why="The correlator marks each read slower than 50 ms against the stalls it lines up "
                "with; the page is on the tail (p99 over the rate window), which a healthy "
                "object store keeps far below 0.5 s."),
         CauseAlert(
            "StallscopeLoaderPageFaults", "loader_major_faults_rate", ">", 100,
            "The loader of a waiting rank reads a mapped dataset from storage.",
            "The loaders of <where> took {{ $value | humanize }} major page faults a second over "
            "the last <window> (threshold <line>): pages of a memory-mapped file read from "
            "storage as the workers touch them, which no read() shows.")),
        "StallscopeShardReadSlow",
        "Check the storage backend's latency for this node; cache or prefetch shards locally.",
        # A stuck FUSE mount hangs every read on it (its readers in D state): when the
        # mount's own probe explains the wait, the slow reads are its symptom. The lab's
        # hang run (CI, 2026-12-03) ranked storage_latency 1.00 over fuse_unhealthy 0.91:
        # the probe reports a frozen mount one timeout late, the D state at once.
        # Write bursts on the node's disks (checkpoints) slow the reads of what shares
        # the device or its backend, never the other way round (a loader reads): when the
        # bursts line up with the stalls (checkpoint_contention explains the wait), the slow
        # reads are their symptom (issue 30, item 4: runs outside the lab ranked
        # storage_latency 0.71-0.79 over checkpoint_contention 0.35-0.39; the lab's
        # checkpoint-read-disk scenario).
        # Failed requests retried with backoff are slow reads too: when the failures line up
        # with the stalls (storage_errors explains the wait), the latency is their symptom.
        symptom_of=("fuse_unhealthy", "checkpoint_contention", "storage_errors")),
    # Issue 31, item 3: a 503-ing object-store prefix idles the fleet with no error in the
    # loop, since the clients retry with backoff; the reads are slow because of it. Standing:
    # a store that throttles a fifth of the requests all along scores ~0 by co-occurrence
    # (the lab's storage-errors run ranked it under 0.05, too_few_workers first); its model
    # (correlate/standing_causes.py) takes the workers' time the failures cost off their
    # load times.
    Cause("storage_errors", "Requests to a storage tier failed (throttled, server errors or "
          "timeouts) and were retried", (
              Line("storage_error_ratio", 0.05, scopes=("rank",)),),
        (CauseAlert(
            "StallscopeStorageErrors", "storage_error_ratio", ">", 0.05,
            "Storage requests of a waiting rank fail.",
            "{{ $value | humanizePercentage }} of the requests to tier {{ $labels.tier }} of <where> "
            "failed over the last <window> (429/503 slow down, 5xx, timeouts; threshold <line>): "
            "the client retries with backoff and the loader waits on the retries."),),
        "StallscopeStorageErrors",
        "A 429/503 'slow down' means the store throttles the request rate on a key prefix: spread "
        "the shards' keys over more prefixes, lower the request rate (fewer, larger reads: "
        "bigger shards, ranged reads of whole samples), or cache them nearer the GPU; 5xx and "
        "timeouts are the store's or the network's: check its health for this node.",
        standing=True),
    Cause("fuse_unhealthy", "The FUSE mount was stuck or down", (
        Line("fuse_up", 0.5, above=False, scopes=("rank",)),
        Line("fuse_probe_seconds", 1.0, scopes=("rank",)),
        Line("fuse_waiting_requests", 9, scopes=("rank",))),
        (CauseAlert(
            "StallscopeFuseMountDown", "fuse_up", "==", 0,
            "A FUSE mount that a waiting rank reads from is down.",
            "FUSE mount {{ $labels.mountpoint }} ({{ $labels.fstype }}) of <where> does not "
            "answer: its daemon is dead or the connection was aborted (ENOTCONN)."),
         CauseAlert(
            "StallscopeFuseMountStuck", "fuse_probe_seconds", ">", 1.0,
            "A FUSE mount that a waiting rank reads from is stuck.",
            "A stat of FUSE mount {{ $labels.mountpoint }} ({{ $labels.fstype }}) of <where> took "
            "{{ $value | humanizeDuration }} (threshold <line>): the daemon is hung or its "
            "backend is far too slow.")),
        "StallscopeFuseMountDown",
        "Check the FUSE daemon of the mount (alive? stuck?); remount it and restart the rank "
        "(a dead mount answers ENOTCONN, a stuck one hangs)."),
    Cause("shm_exhaustion", "/dev/shm was nearly full", (
        Line("shm_used_ratio", 0.9, scopes=("rank",)),),
        (CauseAlert(
            "StallscopeShmNearlyFull", "shm_used_ratio", ">", 0.9,
            "/dev/shm of a waiting rank's pod is nearly full.",
            "/dev/shm of <where> is {{ $value | humanizePercentage }} full (threshold <line>); "
            "DataLoader workers pass every batch through it and die with a bus error when it "
            "fills."),),
        "StallscopeShmNearlyFull",
        "Give the pod a larger /dev/shm (emptyDir medium: Memory with a sizeLimit) or lower "
        "prefetch_factor x num_workers."),
    # A worker OOM-killed at the pod's memory limit (issue 18): judged from the worker's
    # exit (SIGKILL with the memory cgroup's oom_kill count up, exporters/worker_deaths.py),
    # not from a signal moving with the stalls.
    Cause("memory_limit", "A loader worker was OOM-killed at the pod's memory limit", (), (),
          "StallscopeLoaderWorkerKilled",
          "Raise the pod's memory limit to cover num_workers x the workers' RSS (plus /dev/shm, "
          "whose pages count against it), or cut that RSS: keep the dataset's index in numpy "
          "arrays or Arrow, not Python lists and dicts, whose refcount writes copy every page "
          "into each worker (copy-on-access); fewer workers.", computed=True),
    Cause("io_pressure", "Tasks stalled on I/O", (
        Line("psi_io_some_ratio", 0.2), Line("psi_io_full_ratio", 0.1)),
        (CauseAlert(
            "StallscopeIOPressure", "psi_io_some_ratio", ">", 0.2,
            "I/O pressure stalls a waiting rank's pod.",
            "Tasks of <where> were stalled on I/O {{ $value | humanizePercentage }} of the time "
            "over the last <window> (PSI io some; threshold <line>)."),),
        "StallscopeIOPressure",
        "Find what else does I/O on the node (checkpoints, other pods); move it off the training "
        "data's device.", shared=True, symptom_of=("checkpoint_contention",)),
    Cause("memory_pressure", "Tasks stalled on memory", (
        Line("psi_memory_some_ratio", 0.1), Line("psi_memory_full_ratio", 0.05)),
        (CauseAlert(
            "StallscopeMemoryPressure", "psi_memory_some_ratio", ">", 0.1,
            "Memory pressure stalls a waiting rank's pod.",
            "Tasks of <where> were stalled on memory (reclaim, swap-in, thrashing) {{ $value | "
            "humanizePercentage }} of the time over the last <window> (PSI memory some; threshold "
            "<line>)."),),
        "StallscopeMemoryPressure",
        "Raise the pod's memory limit or cut the loader's footprint (fewer workers, smaller "
        "prefetch); check for reclaim of the page cache.", shared=True),
    Cause("cache_miss", "The loader's cache missed", (
        Line("cache_miss_ratio", 0.5, scopes=("rank",)),),
        (CauseAlert(
            "StallscopeCacheHitRateLow", "cache_miss_ratio", ">", 0.5,
            "The data cache of a waiting rank mostly misses.",
            "{{ $value | humanizePercentage }} of the cache lookups in tier {{ $labels.tier }} of "
            "<where> missed over the last <window> (threshold <line>); misses go to the slower "
            "tier."),),
        "StallscopeCacheHitRateLow",
        "Prewarm the cache on this node or size it to the working set."),
    Cause("checkpoint_contention", "Disk write bursts (checkpoints) hit the node", (
        Line("disk_write_bytes_rate", 50e6, scopes=("node",)),), (),
        "StallscopeDataWaitHigh",
        "Write checkpoints to other storage than the training data, or stagger them across ranks.",
        shared=True),
    # A standing cause (issue 29/32): the loader runs on another NUMA node than its GPU.
    # Named when the condition holds and the rank is over the line, scored by how much of
    # the wait its model explains (correlate/standing_causes.py), not by co-occurrence.
    Cause("numa_remote", "The loader ran on another NUMA node than its GPU", (
        Line("numa_remote_cpu_ratio", 0.5, scopes=("rank",)),),
        (CauseAlert(
            "StallscopeNumaRemote", "numa_remote_cpu_ratio", ">", 0.5,
            "A waiting rank's loader runs on another NUMA node than its GPU.",
            "{{ $value | humanizePercentage }} of the loader CPU time of <where> ran on CPUs "
            "outside its GPU's NUMA node (threshold <line>): every batch crosses the "
            "inter-socket link."),),
        "StallscopeNumaRemote",
        "Pin the loader to the GPU's local CPUs: the kubelet's topology manager (policy "
        "single-numa-node or restricted) with cpuManagerPolicy: static and integer CPUs, or "
        "os.sched_setaffinity(0, local_cpus) in worker_init_fn with the GPU's local_cpulist.",
        standing=True),
    # A standing cause (issue 31): a link the loader reads over runs at its capacity while
    # it waits. A link at capacity all along scores near 0 against the stalls by
    # co-occurrence, and more workers only share it: its model (correlate/standing_causes.py)
    # weighs the bytes a batch needs at the compute's pace against what the link gives.
    Cause("bandwidth_bound", "A link the loader reads over ran at its capacity", (
        Line("link_receive_ratio", 0.9, scopes=("node",)),), (),
        "StallscopeDataWaitHigh",
        "Change the bytes/s math: read through a cache tier nearer the GPU (local NVMe, a "
        "node cache), fewer bytes per sample (compression, lower resolution, pre-decoded or "
        "pre-tokenized shards), or more bandwidth (a larger instance, a faster link); more "
        "workers only share the same link.", standing=True),
    Cause("unexplained", "Nothing recorded explains the wait", (), (), "StallscopeDataWaitHigh",
          "Sample the workers' stacks while the stall goes on to see where they spend the "
          "time: `stallscope diagnose POD --stacks` on the pod's node, or `py-spy dump --pid "
          "PID` for each loader worker."),
)
