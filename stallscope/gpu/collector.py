"""``/metrics`` families of the GPU signals, built from the samplers' in-memory state at
each collection of the ``gpu`` exporter (never calling NVML or dcgm-exporter itself).

Series per GPU carry ``gpu``, ``uuid``, ``source`` (nvml / simulated / dcgm) and the
rank labels of the rank it serves (job, rank, pod, namespace, node; empty but ``node``
when no rank is mapped; one series per rank when several ranks share a GPU). Per rank
that is 3 series against the per-rank budget: busy ratio, busy seconds, SM-active.
"""
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..agent.state import LABELS

GPU = ("gpu", "uuid", "source")


def _rank_labels(part, uuid, ranks, node):
    keys = part.mapping.ranks_of.get(uuid, ())
    out = [ranks[k].labels() for k in keys if k in ranks]
    return out or [("", "", "", "", node)]


def families(part, rank_list):
    node = part.node
    ranks = {r.key: r for r in rank_list}
    busy = GaugeMetricFamily(
        "stallscope_gpu_busy_ratio",
        "Share of the newest sample period(s) during which a kernel ran (NVML "
        "utilisation samples, or the simulated GPU).", labels=GPU + LABELS)
    busy_s = CounterMetricFamily(
        "stallscope_gpu_busy_seconds",
        "Seconds during which a kernel ran: rate() is the busy ratio over any window, "
        "however slow the scrape.", labels=GPU + LABELS)
    up = GaugeMetricFamily(
        "stallscope_gpu_up", "1 while the GPU is read; 0 once lost (fell off the bus) "
        "or without a utilisation reading (MIG, vGPU).", labels=GPU + ("node",))
    for gpu, status, ratio, busy_total, _sampled, _pids in part.tracks():
        base = (str(gpu.index), gpu.uuid, gpu.source)
        up.add_metric(base + (node,), 1 if status == "ok" else 0)
        for lv in _rank_labels(part, gpu.uuid, ranks, node):
            if status == "ok" and ratio is not None:
                busy.add_metric(base + lv, ratio)
            busy_s.add_metric(base + lv, busy_total)
    sm = GaugeMetricFamily(
        "stallscope_gpu_sm_active_ratio",
        "SM activity from dcgm-exporter: DCGM_FI_PROF_SM_ACTIVE, or the fallback "
        "named by `field` (GR_ENGINE_ACTIVE, GPU_UTIL/100).", labels=GPU + ("field",) + LABELS)
    for r in part.readings().values():
        lvs = ([("", "", "", "", node)] if ":" in r.gpu
               else _rank_labels(part, r.uuid, ranks, node))
        for lv in lvs:
            sm.add_metric((r.gpu, r.uuid, "dcgm", r.field) + lv, r.value)
    errors = CounterMetricFamily(
        "stallscope_gpu_read_errors", "Failed GPU reads, by source and reason.",
        labels=("source", "reason"))
    for name, counts in ([(s.source.name, s.errors) for s in part.samplers]
                         + [("dcgm", part.dcgm.errors if part.dcgm else {}),
                            ("hook", part.rejected)]):
        for reason, n in sorted(dict(counts).items()):
            errors.add_metric((name, reason), n)
    return [busy, busy_s, up, sm, errors]
