"""``/metrics`` families of the GPU signals, built fresh from the samplers' state on
every scrape (never calling NVML or dcgm-exporter on the scrape path).

Series per GPU carry ``gpu``, ``uuid``, ``source`` (nvml / simulated / dcgm) and the
rank labels of the rank it serves (job, rank, pod, namespace, node; empty but ``node``
when no rank is mapped; one series per rank when several ranks share a GPU). Per rank
that is 3 series against the per-rank budget: busy ratio, busy seconds, SM-active.
"""
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..agent.state import LABELS

GPU = ("gpu", "uuid", "source")


class GpuCollector:
    def __init__(self, part):
        self.part = part

    def describe(self):
        return []

    def _rank_labels(self, uuid, ranks, node):
        keys = self.part.mapping.ranks_of.get(uuid, ())
        out = [ranks[k].labels() for k in keys if k in ranks]
        return out or [("", "", "", "", node)]

    def collect(self):
        part = self.part
        node = part.agent.table.node
        ranks = {r.key: r for r in part.agent.table.snapshot()}
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
        if part.sampler is not None:
            for gpu, status, ratio, busy_total, _sampled, _pids in part.sampler.snapshot():
                base = (str(gpu.index), gpu.uuid, gpu.source)
                up.add_metric(base + (node,), 1 if status == "ok" else 0)
                for lv in self._rank_labels(gpu.uuid, ranks, node):
                    if status == "ok" and ratio is not None:
                        busy.add_metric(base + lv, ratio)
                    busy_s.add_metric(base + lv, busy_total)
        yield busy
        yield busy_s
        yield up
        sm = GaugeMetricFamily(
            "stallscope_gpu_sm_active_ratio",
            "SM activity from dcgm-exporter: DCGM_FI_PROF_SM_ACTIVE, or the fallback "
            "named by `field` (GR_ENGINE_ACTIVE, GPU_UTIL/100).", labels=GPU + ("field",) + LABELS)
        if part.dcgm is not None:
            for r in part.dcgm.snapshot()[1].values():
                lvs = ([("", "", "", "", node)] if ":" in r.gpu
                       else self._rank_labels(r.uuid, ranks, node))
                for lv in lvs:
                    sm.add_metric((r.gpu, r.uuid, "dcgm", r.field) + lv, r.value)
        yield sm
        errors = CounterMetricFamily(
            "stallscope_gpu_read_errors", "Failed GPU reads, by source and reason.",
            labels=("source", "reason"))
        for src in (part.sampler, part.dcgm):
            if src is not None:
                name = getattr(src, "source", src).name
                for reason, n in sorted(dict(src.errors).items()):
                    errors.add_metric((name, reason), n)
        for reason, n in sorted(dict(part.rejected).items()):
            errors.add_metric(("hook", reason), n)
        yield errors
