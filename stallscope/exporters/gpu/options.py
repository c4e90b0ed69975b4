"""Flags of the GPU signals (``--gpu.*``), typed (stallscope.host.options)."""
from __future__ import annotations

import dataclasses
from typing import Any

from ...host.options import flag


@dataclasses.dataclass(frozen=True)
class GpuOptions:
    nvml: bool = flag(True, "--gpu.nvml/--no-gpu.nvml",
                      "Sample each GPU's busy time through NVML (nvidia-ml-py). On a node without "
                      "an NVIDIA driver this says 'not available' once and retries every minute "
                      "(the driver container may still be installing).")
    # 2 s: the buffer loses nothing read this often, and each read of every GPU costs
    # the agent whether or not it has news (1 s: ~0.09 % more of a core at 8 GPUs, issue 31)
    sample_interval: float = flag(2.0, "--gpu.sample-interval",
                                  "How often to read the driver's sample buffer (it holds ~100 "
                                  "samples taken every 1/6 s to 1 s, so up to ~15 s loses nothing).",
                                  lo=0.05, hi=60, metavar="SECONDS")
    simulated: bool = flag(False, "--gpu.simulated",
                           "LAB/DEMO ONLY: add a simulated GPU per rank, busy between a batch's "
                           "arrival and the loop's next next() call; each rank maps to its own. Its "
                           "series and reports carry source=\"simulated\".")
    dcgm_url: str = flag("", "--gpu.dcgm-url",
                         "dcgm-exporter endpoint to read SM-active from, e.g. "
                         "http://localhost:9400/metrics (off when empty). See docs/gpu.md for the "
                         "dcgm-exporter settings that make it useful.", metavar="URL", url=True)
    dcgm_interval: float = flag(1.0, "--gpu.dcgm-interval",
                                "How often to read the dcgm-exporter endpoint (match its -c interval).",
                                lo=0.1, hi=600, metavar="SECONDS")
    # A pynvml stand-in (tests, benchmarks); no flag.
    nvml_module: Any = None
