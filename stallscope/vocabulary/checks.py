"""Set-up checks (issue 32, item 3): DataLoader set-ups that are wrong on their face at
the first batch, each with the number that makes it wrong and its fix. The agent
evaluates them at iterator start (correlate/checks.py) and shows the failures as
warnings in /api/v1/diagnosis, ``stallscope diagnose`` and ``stallscope run``'s report.
A warning is not a verdict: no alert is generated for a check.
"""
from .entries import Check

# torch's default prefetch_factor with workers (torch/utils/data/dataloader.py).
DEFAULT_PREFETCH = 2

CHECKS = (
    Check("no_workers_with_gpu", "num_workers=0 on a rank that drives a GPU",
          "num_workers", "count", "at least 1 with a GPU",
          "num_workers is <value> while the rank drives a GPU: the training loop loads every "
          "batch itself and the GPU idles meanwhile.",
          "Set num_workers to 2 or more (up to the CPU quota's cores minus one)."),
    Check("shm_too_small", "/dev/shm smaller than the batches the workers hold in it",
          "shm_size_bytes", "bytes", "num_workers x prefetch_factor x the measured batch bytes",
          "/dev/shm is <value>, less than the <line> that num_workers x prefetch_factor batches "
          "of the measured size need: a worker's allocation fails (\"unable to allocate shared "
          "memory\", or a Bus error on older torch).",
          "Give the pod a /dev/shm of at least that size (an emptyDir with medium: Memory and a "
          "sizeLimit mounted at /dev/shm), or lower num_workers x prefetch_factor or the batch "
          "size."),
    Check("workers_over_quota", "more loader workers than the CPU quota's cores can run",
          "num_workers", "count", "the CPU quota's cores",
          "num_workers is <value>, more than the <line> cores the pod's CPU quota runs at once: "
          "the workers take turns, and the CFS quota throttles them.",
          "Lower num_workers to the quota's cores minus one, or raise the pod's CPU limit."),
    Check("fractional_cpu_limit", "a fractional CPU limit on a pod that wants pinned CPUs",
          "cpu_limit_cores", "cores", "an integer number of cores",
          "The pod's CPU limit is <value> cores, not an integer: the kubelet's static CPU manager "
          "gives exclusive (pinnable, NUMA-aligned) CPUs only to Guaranteed pods with integer CPU "
          "requests, so this GPU rank runs on the shared pool.",
          "Set the CPU request and limit to the same integer (Guaranteed QoS) so the static CPU "
          "manager and the topology manager pin the pod's CPUs next to its GPU."),
    Check("pin_memory_off_with_gpu", "pin_memory=False on a rank that drives a GPU",
          "pin_memory", "flag", "True with a GPU",
          "pin_memory is <value> while the rank drives a GPU: each host-to-device copy first "
          "stages the batch in pinned memory on the training thread, and cannot overlap compute.",
          "Set pin_memory=True (and .to(device, non_blocking=True))."),
    Check("workers_restart_each_epoch", "non-persistent workers on epochs shorter than their "
          "start-up", "epoch_seconds", "seconds", "the workers' start-up time",
          "Each epoch lasts <value> and its workers take <line> to start (persistent_workers is "
          "False): they are forked again at every epoch and the loop waits for them each time.",
          "Set persistent_workers=True; make worker start-up cheap (open files lazily, not in "
          "Dataset.__init__)."),
)
