"""``stallscope agent`` flags of the GPU signals. Options land in ``Config.options``
under the names given here (gpu_nvml, gpu_sample_interval, gpu_simulated, gpu_dcgm_url,
gpu_dcgm_interval)."""
import click


def _url(ctx, param, value):
    if value and not value.startswith(("http://", "https://")):
        raise click.BadParameter("must be an http:// or https:// URL, e.g. "
                                 "http://localhost:9400/metrics")
    return value


OPTIONS = [
    click.option("--gpu.nvml/--no-gpu.nvml", "gpu_nvml", default=True, show_default=True,
                 help="Sample each GPU's busy time through NVML (nvidia-ml-py). On a node "
                      "without an NVIDIA driver this says 'not available' once and retries "
                      "every minute (the driver container may still be installing)."),
    click.option("--gpu.sample-interval", "gpu_sample_interval", default=1.0, show_default=True,
                 type=click.FloatRange(0.05, 60), metavar="SECONDS",
                 help="How often to read the driver's sample buffer (it holds ~100 samples "
                      "taken every 1/6 s to 1 s, so up to ~15 s loses nothing)."),
    click.option("--gpu.simulated", "gpu_simulated", is_flag=True, default=False,
                 help="LAB/DEMO ONLY: add a simulated GPU per rank, busy between a batch's "
                      "arrival and the loop's next next() call; each rank maps to its own. Its "
                      "series and reports carry source=\"simulated\"."),
    click.option("--gpu.dcgm-url", "gpu_dcgm_url", default="", metavar="URL", callback=_url,
                 help="dcgm-exporter endpoint to read SM-active from, e.g. "
                      "http://localhost:9400/metrics (off when empty). See docs/gpu.md for "
                      "the dcgm-exporter settings that make it useful."),
    click.option("--gpu.dcgm-interval", "gpu_dcgm_interval", default=1.0, show_default=True,
                 type=click.FloatRange(0.1, 600), metavar="SECONDS",
                 help="How often to read the dcgm-exporter endpoint (match its -c interval)."),
]
