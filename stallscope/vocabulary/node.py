"""The node exporters (the registry: one line each, like node_exporter's collectors),
their metrics and their correlator signals.

Adding a node signal: ``stallscope/exporters/<name>.py`` with an ``Exporter`` subclass,
and here its registry line, its metrics and its signals. The ``--exporter.<name>``
flags, scheduling, deadline and self-health metrics come with the registry line.
"""
from .entries import Exporter, LoaderState, Metric, Signal
from .labels import CONTAINER, GPU, MOUNT, POD, RANK

EXPORTERS = (
    Exporter("cfs", "cfs:CfsExporter", True, "CFS quota and throttling of the ranks' cgroups."),
    Exporter("psi", "psi:PsiExporter", True,
             "Pressure stall information of the node and the ranks' cgroups."),
    Exporter("shm", "shm:ShmExporter", True, "/dev/shm size and use, as the ranks and the node see it."),
    Exporter("fuse", "fuse:FuseExporter", True,
             "Health of the FUSE mounts the ranks read from (stuck, ENOTCONN)."),
    Exporter("workers", "workers:WorkersExporter", True,
             "Loader workers: alive, D state, CPU, RSS, exits."),
    Exporter("gpu", "gpu:GpuExporter", True,
             "GPU busy samples (NVML), SM-active (dcgm-exporter), GPU-to-rank map; see --gpu.*."),
    Exporter("disk", "disk:DiskExporter", True,
             "Node block-device write rate (checkpoint bursts), a correlator sample only."),
    Exporter("sched", "sched:SchedExporter", True,
             "Run-queue wait of the loader workers (CPU starvation) and the node's idle CPUs, "
             "correlator samples only."),
    Exporter("numa", "numa:NumaExporter", True,
             "NUMA placement: the share of each rank's loader CPU time off its GPU's NUMA node."),
    Exporter("loaderstate", "loaderstate:LoaderStateExporter", True,
             "Loader time split: each worker's and the training process's state, sampled "
             "from procfs 2.5 times a second at random gaps (on CPU, waiting for CPU, blocked "
             "reading storage by mount, network, idle, handing over); "
             "benchmarks/bench_loaderstate.py measures its cost."),
    Exporter("loaderio", "loaderio:LoaderIoExporter", True,
             "Bytes each rank's loader reads (all reads, and from block devices), from the "
             "kernel's I/O accounting of its workers (/proc/<pid>/io)."),
    Exporter("links", "links:LinksExporter", True,
             "The node's network links: receive throughput against capacity (link speed, or "
             "--exporter.links.capacity), as a share per pod on the node."),
    Exporter("iolimit", "iolimit:IoLimitExporter", True,
             "The bytes a second each rank's cgroup may read from a block device (blkio / io.max), "
             "the device capacity of the predictions; a host fact only."),
    Exporter("pagefaults", "pagefaults:PageFaultsExporter", True, "Major page faults of the ranks' loaders."),
    Exporter("cpuset", "cpuset:CpusetExporter", True,
             "CPU exclusivity: each pod's QoS class, cpuset, and CPUs shared with other "
             "containers or the node's FUSE daemons."),
)

_PSI = tuple(
    Metric("stallscope_pressure_%s_%s_seconds_total" % (res, name), "counter",
           "PSI %s: time %s tasks were stalled on %s (node, or a cgroup with container set)."
           % (kind, "some" if kind == "some" else "all non-idle", res), CONTAINER, "psi")
    for res in ("cpu", "io", "memory") for kind, name in (("some", "waiting"), ("full", "stalled")))

METRICS = (
    Metric("stallscope_cpu_cfs_periods_total", "counter",
           "CFS enforcement periods elapsed (cpu.stat nr_periods).", CONTAINER, "cfs"),
    Metric("stallscope_cpu_cfs_throttled_periods_total", "counter",
           "CFS periods in which the cgroup was throttled.", CONTAINER, "cfs"),
    Metric("stallscope_cpu_cfs_throttled_seconds_total", "counter",
           "Time the cgroup's threads spent throttled by its quota.", CONTAINER, "cfs"),
    Metric("stallscope_cpu_cfs_quota_cores", "gauge",
           "Effective CFS quota in cores (tightest along the cgroup's ancestors).", CONTAINER, "cfs"),
    Metric("stallscope_cpu_cfs_quota_oversubscribed", "gauge",
           "1 if the cgroup runs more rank processes (main + loader workers) than its quota has "
           "cores (PyTorch sizes workers from CPU affinity, not the quota: pytorch/pytorch#46867).",
           CONTAINER, "cfs"),
) + _PSI + (
    Metric("stallscope_shm_size_bytes", "gauge",
           "Size of /dev/shm as the pod's processes see it (node-wide: pod empty).", POD, "shm"),
    Metric("stallscope_shm_used_bytes", "gauge",
           "Bytes used in /dev/shm (statvfs: includes unlinked PyTorch segments).", POD, "shm"),
    Metric("stallscope_fuse_up", "gauge", "1 if the FUSE mount answered its last probe (statfs); "
           "0 if stuck, disconnected (ENOTCONN) or failing.", MOUNT, "fuse"),
    Metric("stallscope_fuse_probe_seconds", "gauge", "Latency of the last probe; of a stuck "
           "probe, how long it has been waiting.", MOUNT, "fuse"),
    Metric("stallscope_fuse_waiting_requests", "gauge", "Requests in flight on the mount's FUSE "
           "connection (fusectl 'waiting').", MOUNT, "fuse"),
    Metric("stallscope_fuse_probe_failures_total", "counter", "Failed probes, by reason: stuck or "
           "the errno (ENOTCONN: the daemon died).", MOUNT + ("reason",), "fuse"),
    Metric("stallscope_loader_workers_alive", "gauge",
           "Loader worker processes of the rank that are alive.", RANK, "workers"),
    Metric("stallscope_loader_workers_dstate", "gauge", "Loader workers in uninterruptible sleep "
           "(D state: blocked in the kernel, e.g. on a hung mount).", RANK, "workers"),
    Metric("stallscope_loader_read_bytes_total", "counter",
           "Bytes the pod's loaders read, all generations of their workers (a training process "
           "without workers: its own): io=all every read() (page cache, pipes; not a socket's "
           "recv(): /proc/<pid>/io rchar), io=block what they fetched from block devices (read_bytes). "
           "Per pod, off the per-rank series budget; per rank in /api/v1/ranks (loader_io).",
           POD + ("io",), "loaderio"),
    Metric("stallscope_loader_major_faults_total", "counter",
           "Major page faults of the pod's loaders, all generations of their workers (a training "
           "process without workers: its own): pages read from storage as a mapped file was "
           "touched. Per pod, off the per-rank series budget.", POD, "pagefaults"),
    Metric("stallscope_link_receive_ratio", "gauge",
           "The share of its capacity (link speed, or --exporter.links.capacity) at which an "
           "interface of the pod's node received over the last collection: one series per pod "
           "with ranks on the node and interface read, so that a pod's cause query finds its "
           "node's links.", POD + ("interface",), "links"),
    Metric("stallscope_loader_workers_cpu_seconds_total", "counter",
           "CPU time used by the rank's loader workers, all generations.", RANK, "workers"),
    Metric("stallscope_loader_worker_max_resident_memory_bytes", "gauge",
           "RSS of the rank's largest loader worker.", RANK, "workers"),
    Metric("stallscope_loader_worker_exits_total", "counter",
           "Loader workers of the pod seen ending by a signal, by why (each reason from 0): "
           "shm_exhaustion (SIGBUS, "
           "/dev/shm full), memory_limit (SIGKILL by the OOM killer of the worker's memory "
           "cgroup), native_crash (SIGSEGV, SIGABRT, SIGILL, SIGFPE), killed (another SIGKILL), "
           "other. Kept 15 minutes after the pod's ranks are gone.", POD + ("reason",),
           "workers"),
    Metric("stallscope_loader_worker_cpu_seconds_total", "counter",
           "CPU time of one loader worker (--exporter.workers.per-worker).", RANK + ("worker",),
           "workers"),
    Metric("stallscope_loader_worker_resident_memory_bytes", "gauge",
           "RSS of one loader worker (--exporter.workers.per-worker).", RANK + ("worker",), "workers"),
    Metric("stallscope_gpu_busy_ratio", "gauge", "Share of the newest sample period(s) during "
           "which a kernel ran (NVML utilisation samples, or the simulated GPU).", GPU + RANK, "gpu"),
    Metric("stallscope_gpu_busy_seconds_total", "counter", "Seconds during which a kernel ran: "
           "rate() is the busy ratio over any window, however slow the scrape.", GPU + RANK, "gpu"),
    Metric("stallscope_gpu_up", "gauge", "1 while the GPU is read; 0 once lost (fell off the bus) "
           "or without a utilisation reading (MIG, vGPU).", GPU + ("node",), "gpu"),
    Metric("stallscope_gpu_sm_active_ratio", "gauge", "SM activity from dcgm-exporter: "
           "DCGM_FI_PROF_SM_ACTIVE, or the fallback named by `field` (GR_ENGINE_ACTIVE, "
           "GPU_UTIL/100).", GPU + ("field",) + RANK, "gpu"),
    Metric("stallscope_gpu_read_errors_total", "counter", "Failed GPU reads, by source and reason.",
           ("source", "reason"), "gpu"),
    Metric("stallscope_loader_numa_remote_cpu_ratio", "gauge", "Share of the CPU time of the "
           "loader (workers and main process) spent on CPUs outside its GPU's NUMA node, the "
           "pod's most remote rank's (/proc/<pid>/stat processor, sysfs node cpulists and the "
           "GPU's numa_node; per pod, off the per-rank series budget).", POD, "numa"),
    Metric("stallscope_loader_worker_time_ratio", "gauge", "Share of the pod's loader-worker "
           "time in each state over the sampling window (procfs: schedstat, syscall, the fd "
           "it reads; states on_cpu, cpu_wait, storage, network, idle, sleeping; the rest is "
           "handoff and other). Per pod, off the per-rank series budget.", POD + ("state",),
           "loaderstate"),
    Metric("stallscope_loader_main_cpu_wait_ratio", "gauge", "Share of the training "
           "process's main-thread time runnable but waiting for a CPU (a starved or throttled "
           "consumer), over the sampling window; per pod.", POD, "loaderstate"),
    Metric("stallscope_pod_cpuset_cpus", "gauge", "CPUs the cpuset of the pod's container allows "
           "(cpuset.cpus.effective), with the pod's QoS class from its cgroup path (empty off "
           "Kubernetes).", POD + ("qos_class",), "cpuset"),
    Metric("stallscope_pod_cpuset_exclusive", "gauge", "1 when the pod's cpuset is its own: fewer "
           "CPUs than the node's and none shared with another container cgroup (the static CPU "
           "manager's exclusive CPUs); 0 on the shared pool.", POD, "cpuset"),
    Metric("stallscope_pod_cpuset_fuse_daemon_cpus", "gauge", "CPUs of the pod's cpuset that the "
           "node's FUSE daemons (processes holding /dev/fuse open) may also run on.", POD, "cpuset"),
)


def _psi(res, kind):
    name = "waiting" if kind == "some" else "stalled"
    return Signal(
        "psi_%s_%s_ratio" % (res, kind), "ratio", ("rank", "node"), "psi",
        "PSI %s %s: share of time tasks stalled on %s (the rank's cgroup, or the node)."
        % (res, kind, res),
        "sum by (namespace, pod) (rate(stallscope_pressure_%s_%s_seconds_total{pod!=\"\",$sel}[$w]))"
        % (res, name), ("namespace", "pod"))


SIGNALS = (
    Signal("cfs_throttled_ratio", "ratio", ("rank",), "cfs",
           "Throttled CFS periods per period, worst of the rank's cgroups.",
           "sum by (namespace, pod, container) (rate(stallscope_cpu_cfs_throttled_periods_total{$sel}[$w]))"
           "\n/\nsum by (namespace, pod, container) (rate(stallscope_cpu_cfs_periods_total{$sel}[$w]))",
           ("namespace", "pod", "container")),
    Signal("cfs_throttled_seconds_rate", "count", ("rank",), "cfs",
           "Throttled seconds per second of the rank's most throttled cgroup (threads held back)."),
    Signal("cfs_held_back_ratio", "ratio", ("rank",), "cfs",
           "Share of the time a runnable process of the rank's most throttled cgroup was held back "
           "by its CFS quota: the throttled seconds a second over the CPUs its processes spread across."),
    Signal("workers_runqueue_ratio", "ratio", ("rank",), "sched",
           "Run-queue wait per second, averaged over the rank's loader workers: runnable, no CPU."),
    Signal("node_cpu_idle_cores", "count", ("node",), "sched",
           "CPUs of the node idle (idle and iowait time of /proc/stat, in cores): what more "
           "loader workers could run on, beside what the workers use now."),
    _psi("cpu", "some"), _psi("io", "some"), _psi("io", "full"),
    _psi("memory", "some"), _psi("memory", "full"),
    Signal("shm_used_ratio", "ratio", ("rank", "node"), "shm",
           "Share of /dev/shm in use, as the rank (or the node) sees it.",
           "max by (namespace, pod) (stallscope_shm_used_bytes{pod!=\"\",$sel} / "
           "stallscope_shm_size_bytes{pod!=\"\",$sel})", ("namespace", "pod")),
    Signal("shm_free_bytes", "bytes", ("rank", "node"), "shm", "Bytes free in /dev/shm."),
    Signal("fuse_up", "flag", ("rank",), "fuse",
           "1 when every FUSE mount the rank sees answered its last probe.",
           "stallscope_fuse_up{$sel}", ("namespace", "pod", "mountpoint")),
    Signal("fuse_probe_seconds", "seconds", ("rank",), "fuse",
           "Slowest last probe of the rank's FUSE mounts (of a stuck one, how long so far).",
           "stallscope_fuse_probe_seconds{$sel}", ("namespace", "pod", "mountpoint")),
    Signal("fuse_waiting_requests", "count", ("rank",), "fuse",
           "Requests in flight on the rank's FUSE connections (fusectl).",
           "stallscope_fuse_waiting_requests{$sel}", ("namespace", "pod", "mountpoint")),
    Signal("workers_alive", "count", ("rank",), "workers", "Loader workers of the rank alive."),
    Signal("workers_oom_killed", "count", ("rank",), "workers",
           "Loader workers of the rank OOM-killed at its memory limit since the previous "
           "collection (worker_deaths.py: SIGKILL with the memory cgroup's oom_kill up)."),
    Signal("workers_shm_killed", "count", ("rank",), "workers",
           "Loader workers of the rank killed by SIGBUS with /dev/shm full since the previous "
           "collection (worker_deaths.py)."),
    Signal("workers_dstate", "count", ("rank",), "workers",
           "Loader workers of the rank in D state (blocked in the kernel).",
           "stallscope_loader_workers_dstate{$sel}", ("namespace", "job", "rank", "pod", "node")),
    Signal("workers_cpu_ratio", "ratio", ("rank",), "workers",
           "CPU seconds per second of all the rank's loader workers together.",
           "rate(stallscope_loader_workers_cpu_seconds_total{$sel}[$w])",
           ("namespace", "job", "rank", "pod", "node")),
    Signal("loader_read_bytes_rate", "bytes_rate", ("rank",), "loaderio",
           "Bytes per second the rank's loader read (every read(): page cache, pipes; a socket's "
           "recv() is not counted by the kernel).",
           "rate(stallscope_loader_read_bytes_total{io=\"all\",$sel}[$w])",
           ("namespace", "job", "pod", "node")),
    Signal("loader_life_read_bytes_per_batch", "bytes", ("rank",), "loaderio",
           "Bytes the rank's loader read (every read(); not a socket's recv()) per batch it "
           "delivered, over its life since the agent first counted it: a tier it read early "
           "and no longer (a local cache's hits) still shows.",
           "stallscope_loader_read_bytes_total{io=\"all\",$sel} / on (namespace, pod) "
           "sum by (namespace, pod) (stallscope_data_wait_seconds_count{$sel})",
           ("namespace", "job", "pod", "node")),
    Signal("loader_block_read_bytes_rate", "bytes_rate", ("rank",), "loaderio",
           "Bytes per second the rank's loader fetched from block devices.",
           "rate(stallscope_loader_read_bytes_total{io=\"block\",$sel}[$w])",
           ("namespace", "job", "pod", "node")),
    Signal("loader_major_faults_rate", "count_rate", ("rank",), "pagefaults",
           "Major page faults a second of the rank's loader: pages of a mapped file read from storage.",
           "sum by (namespace, pod) (rate(stallscope_loader_major_faults_total{$sel}[$w]))",
           ("namespace", "pod")),
    Signal("link_receive_bytes_rate", "bytes_rate", ("node",), "links",
           "Bytes per second received by the node's busiest network interface read "
           "(physical, or named by --exporter.links.include)."),
    Signal("link_receive_ratio", "ratio", ("node",), "links",
           "The highest share of its capacity (link speed, or --exporter.links.capacity) an "
           "interface of the node received at; in Prometheus per pod (its node's links).",
           "max by (namespace, pod) (stallscope_link_receive_ratio{$sel})",
           ("namespace", "pod"), condition=True),
    Signal("link_capacity_bytes_rate", "bytes_rate", ("node",), "links",
           "What the interface with the highest link_receive_ratio can receive, bytes per second."),
    Signal("disk_read_bytes_rate", "bytes_rate", ("node",), "disk",
           "Bytes per second read from the node's physical block devices."),
    Signal("disk_busy_ratio", "ratio", ("node",), "disk",
           "The highest share of time a physical block device had I/O in flight "
           "(/proc/diskstats io_ticks)."),
    Signal("disk_write_bytes_rate", "bytes_rate", ("node",), "disk",
           "Bytes per second written to the node's physical block devices."),
    Signal("gpu_busy_ratio", "ratio", ("rank", "gpu"), "gpu",
           "Share of each GPU sample period in which a kernel ran (NVML or simulated).",
           "rate(stallscope_gpu_busy_seconds_total{$sel}[$w])",
           ("namespace", "job", "rank", "pod", "node", "gpu", "uuid", "source"), cadence="gpu"),
    Signal("numa_remote_cpu_ratio", "ratio", ("rank",), "numa",
           "Share of the rank's loader CPU time on CPUs outside its GPU's NUMA node.",
           "max by (namespace, pod) (stallscope_loader_numa_remote_cpu_ratio{$sel})",
           ("namespace", "pod"), condition=True),
    *(Signal("loader_workers_%s_ratio" % state, "ratio", ("rank",), "loaderstate",
             "Share of the rank's loader-worker time %s (sampled from procfs)." % text,
             'max by (namespace, pod) (stallscope_loader_worker_time_ratio{$sel, state="%s"})' % state,
             ("namespace", "pod"))
      for state, text in (("on_cpu", "on a CPU"), ("cpu_wait", "runnable, waiting for a CPU"),
                          ("storage", "blocked reading storage"), ("network", "blocked on the network"),
                          ("idle", "idle, waiting for work on the index queue"),
                          ("sleeping", "in a sleep call (a retry's backoff, a rate limiter)"))),
    Signal("loader_main_cpu_wait_ratio", "ratio", ("rank",), "loaderstate",
           "Share of the training process's main-thread time runnable, waiting for a CPU.",
           "max by (namespace, pod) (stallscope_loader_main_cpu_wait_ratio{$sel})", ("namespace", "pod")),
    Signal("loader_main_on_cpu_ratio", "ratio", ("rank",), "loaderstate",
           "Share of the training process's main-thread time on a CPU: beside its CPU wait, "
           "how a handoff's time splits between its work and its wait for a core (the "
           "correlator's time budget)."),
    Signal("cpuset_exclusive", "flag", ("rank",), "cpuset",
           "1 when the rank's pod has CPUs of its own (an exclusive cpuset), 0 on the shared pool.",
           "max by (namespace, pod) (stallscope_pod_cpuset_exclusive{$sel})",
           ("namespace", "pod"), condition=True),
    Signal("cpuset_fuse_daemon_cpus", "count", ("rank",), "cpuset",
           "CPUs of the rank's pod that the node's FUSE daemons may also run on.",
           "max by (namespace, pod) (stallscope_pod_cpuset_fuse_daemon_cpus{$sel})",
           ("namespace", "pod"), condition=True),
    Signal("gpu_sm_active_ratio", "ratio", ("rank", "gpu"), "gpu",
           "SM activity from dcgm-exporter.", "stallscope_gpu_sm_active_ratio{$sel}",
           ("namespace", "job", "rank", "pod", "node", "gpu", "uuid"), cadence="gpu"),
)


# The states a loader task's time is split into (exporters/loaderstate.py; issue 30).
LOADER_STATES = (
    LoaderState("on_cpu", "running on a CPU (schedstat)"),
    LoaderState("cpu_wait", "runnable, waiting for a CPU: a busy node or a CFS-throttled cgroup (schedstat)"),
    LoaderState("storage", "blocked reading or opening a file, or faulting a mapped one in "
                "(syscall, D state)"),
    LoaderState("network", "blocked on a network socket (a remote fetch)"),
    LoaderState("idle", "waiting for work: a worker on its index queue, the training process for a batch"),
    LoaderState("handoff", "handing a batch over: writing to the result queue, passing descriptors"),
    LoaderState("sleeping", "in a sleep call"),
    LoaderState("other", "off the CPU in anything else (a lock, a call not classified)"),
)
