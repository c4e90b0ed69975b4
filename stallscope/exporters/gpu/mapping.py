"""Which rank drives which GPU, from the best evidence available, per rank:

1. ``cuda_device``: the hook's report of the CUDA device the training loop's thread uses
   (its UUID; device indices are renumbered by CUDA_VISIBLE_DEVICES, UUIDs are not).
2. ``nvml_process``: NVML lists the rank's main process (a host PID: the agent needs
   hostPID) among a GPU's compute processes. A process often holds a stray context on a
   second GPU (a few hundred MiB on cuda:0 from a library initialising the default
   device), so the GPU where it holds the most memory wins.
3. ``dcgm_pod``: dcgm-exporter labels a GPU with the pod that was allocated it; used only
   when that pod has exactly one GPU and one rank on this node.
4. ``simulated``: the simulated GPU of a rank, by construction.

A rank maps to one GPU; a GPU may serve several ranks (several processes per GPU).
"""
import collections

VIA = ("cuda_device", "nvml_process", "dcgm_pod", "simulated")


def uuid_key(uuid):
    """GPU UUIDs as NVML ("GPU-3ee8...") and torch ("3ee8...") spell them, made equal."""
    u = str(uuid or "").strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            return u[len(prefix):]
    return u


class Mapping:
    def __init__(self, gpu_of=None):
        self.gpu_of = gpu_of or {}  # rank key -> (uuid, via)
        self.ranks_of = collections.defaultdict(list)  # uuid -> [rank key]
        for key, (uuid, _via) in sorted(self.gpu_of.items()):
            self.ranks_of[uuid].append(key)

    def via(self, key):
        found = self.gpu_of.get(key)
        return found[1] if found else None


def build(ranks, gpus, dcgm_pods=None, devices=None):
    """ranks: the host's ranks; gpus: [(Gpu, {pid: used_bytes})]; dcgm_pods: {uuid:
    (namespace, pod)} for every GPU dcgm-exporter reports (pod "" when unallocated);
    devices: {rank key: the hook's CUDA device report}. Returns a Mapping."""
    by_key = {uuid_key(u): u for u in (dcgm_pods or {})}  # GPUs dcgm-exporter knows
    by_key.update((uuid_key(g.uuid), g.uuid) for g, _ in gpus)
    holders = collections.defaultdict(list)  # pid -> [(used_bytes, uuid)]
    for g, pids in gpus:
        for pid, used in pids.items():
            holders[pid].append((used, g.uuid))
    pod_gpus = collections.defaultdict(list)
    for uuid, pod in (dcgm_pods or {}).items():
        if uuid_key(uuid) in by_key and pod[1]:
            pod_gpus[pod].append(by_key[uuid_key(uuid)])
    pod_ranks = collections.Counter((r.ident["namespace"], r.ident["pod"]) for r in ranks)
    sim = {g.rank_key: g.uuid for g, _ in gpus if g.rank_key is not None}
    gpu_of = {}
    for r in ranks:
        if r.key in sim:
            gpu_of[r.key] = (sim[r.key], "simulated")
            continue
        device = (devices or {}).get(r.key)
        uuid = by_key.get(uuid_key(device.get("uuid"))) if device else None
        if uuid:
            gpu_of[r.key] = (uuid, "cuda_device")
            continue
        held = holders.get(r.pid)
        if held:
            gpu_of[r.key] = (max(held)[1], "nvml_process")
            continue
        pod = (r.ident["namespace"], r.ident["pod"])
        if len(pod_gpus.get(pod, ())) == 1 and pod_ranks[pod] == 1:
            gpu_of[r.key] = (pod_gpus[pod][0], "dcgm_pod")
    return Mapping(gpu_of)
