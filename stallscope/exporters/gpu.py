"""gpu: GPU busy samples (NVML, or the lab's simulated GPU), SM-active from
dcgm-exporter, and the GPU <-> rank map. The work lives in stallscope/gpu/ (samplers in
their own threads at the driver's rate); this exporter drives it at each collection and
returns its families. Settings: the ``--gpu.*`` flags (docs/gpu.md).
"""
from ..gpu.part import GpuPart
from . import base


class GpuExporter(base.Exporter):
    name = "gpu"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.part = GpuPart(ctx.options, ctx.node, ctx.samples, log=self.note, lock=ctx.lock)

    def attach(self, agent):
        self.part.attach(agent)

    def unavailable(self):
        return self.part.unavailable()

    def collect(self, ranks):
        self.part.start()
        self.part.refresh(ranks)
        return self.part.families(ranks)
