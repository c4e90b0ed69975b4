"""The GPU's side of "is the GPU waiting on data?": busy samples per GPU at the driver's
own rate, SM-active from dcgm-exporter, and which rank drives which GPU.

- source.py   the sampler interface (``Gpu``, ``Unavailable``), the per-GPU ring of
              timestamped samples and the ``Sampler`` thread that drives a source
- nvml.py     the real source: NVML utilisation samples through nvidia-ml-py
- sim.py      the lab's source: a clearly labelled simulated GPU per rank, busy between
              a batch's arrival and the loop's next ``next()`` call
- dcgm.py     reads SM-active (or its fallbacks) from a dcgm-exporter endpoint
- mapping.py  GPU <-> rank: the hook's CUDA device report, NVML's compute processes,
              dcgm-exporter's pod labels
- collector.py  the /metrics families, from the samplers' state
- exporter.py the ``gpu`` exporter: the GPU signals as one part; flags in options.py

Samples are ``(t_end_ns, period_ns, busy_ratio)`` on CLOCK_MONOTONIC, the clock of the
hook's batch events, so the correlator lines them up without conversion.
"""
from .exporter import GpuExporter

__all__ = ["GpuExporter"]
