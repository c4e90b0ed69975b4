"""Wires the GPU signals into the agent: one ``install(agent)`` call.

- a ``Sampler`` over NVML (default) or, with ``--gpu.simulated``, over the simulated
  GPU; a ``DcgmReader`` when ``--gpu.dcgm-url`` is given; each in its own thread,
  started by the agent's scheduler, so a hung driver call never stalls a scrape;
- the hook's CUDA device report (``"cuda"`` in a report, validated here);
- the GPU <-> rank map, refreshed every second (mapping.py);
- samples into ``agent.samples``: scope ``("gpu", uuid)`` and, for a mapped rank, the
  rank's key, with signals ``gpu_busy_ratio`` (NVML or simulated) and
  ``gpu_sm_active_ratio`` (dcgm-exporter), values in [0, 1] at each sample's end time;
- ``/metrics`` families (collector.py), ``"gpu"`` in /api/v1/timeline, ``json_gpu`` in
  /api/v1/ranks.
"""
import collections
import re
import sys

from . import collector, mapping
from .dcgm import DcgmReader
from .nvml import NvmlSource
from .sim import SimulatedSource
from .source import Sampler

_UUID_RE = re.compile(r"^[A-Za-z0-9-]{1,96}$")


def _log(message):
    print("stallscope agent: gpu: %s" % message, file=sys.stderr, flush=True)


class GpuPart:
    def __init__(self, agent, nvml=None, log=_log):
        opts = agent.config.options
        self.agent = agent
        self.log = log
        self.rejected = collections.Counter()
        self.mapping = mapping.Mapping()
        interval = opts.get("gpu_sample_interval") or 1.0
        self.sampler = None
        if opts.get("gpu_simulated"):
            log("source: SIMULATED (--gpu.simulated): no real GPU is read; every GPU series "
                "and report carries source=\"simulated\"")
            self.sampler = Sampler(SimulatedSource(agent.table), interval=min(interval, 0.5),
                                   on_samples=self._on_samples, log=log)
        elif opts.get("gpu_nvml", True):
            # gpu_nvml_module: a pynvml stand-in (tests, benchmarks); not a CLI flag.
            source = NvmlSource(nvml or opts.get("gpu_nvml_module"))
            self.sampler = Sampler(source, interval=interval, on_samples=self._on_samples, log=log)
        url = opts.get("gpu_dcgm_url")
        self.dcgm = None
        if url:
            every = opts.get("gpu_dcgm_interval") or 1.0
            self.dcgm = DcgmReader(url, interval=every, timeout=min(2.0, max(0.5, every)),
                                   on_readings=self._on_readings, log=log)

    def install(self):
        a = self.agent
        a.table.handlers.append(self.on_message)
        a.registry.register(collector.GpuCollector(self))
        a.add_timeline_part("gpu", self.timeline_part)
        a.every(1.0, self.tick)
        return self

    # -- the hook's report (under the table lock, for every accepted message) -----------
    def on_message(self, msg, rank, pid):
        cuda = msg["raw"].get("cuda")
        if cuda is None or msg["role"] != "main":
            return
        index = cuda.get("index") if isinstance(cuda, dict) else None
        uuid = cuda.get("uuid") if isinstance(cuda, dict) else None
        if (type(index) is not int or not 0 <= index < 4096 or not isinstance(uuid, str)
                or not _UUID_RE.match(uuid)):
            self.rejected["bad_cuda"] += 1
            return
        rank.extra["gpu_device"] = {"index": index, "uuid": uuid}

    # -- sinks (sampler and reader threads) ---------------------------------------------
    def _on_samples(self, gpu, samples):
        record = self.agent.samples.record
        scope = ("gpu", gpu.uuid)
        for t, _period, ratio in samples:
            record(scope, "gpu_busy_ratio", ratio, t)
        for key in self.mapping.ranks_of.get(gpu.uuid, ()):
            for t, _period, ratio in samples:
                record(key, "gpu_busy_ratio", ratio, t)

    def _on_readings(self, readings, t_ns):
        record = self.agent.samples.record
        for r in readings.values():
            instance = r.gpu.partition(":")[2]
            scope = ("gpu", r.uuid + (":" + instance if instance else ""))
            record(scope, "gpu_sm_active_ratio", r.value, t_ns)
            if not instance:
                for key in self.mapping.ranks_of.get(r.uuid, ()):
                    record(key, "gpu_sm_active_ratio", r.value, t_ns)

    # -- every second (the agent's scheduler) -------------------------------------------
    def gpus(self):
        """{uuid: (index label, source)} of every GPU known to a sampler or dcgm-exporter."""
        out = {}
        if self.dcgm is not None:
            for r in self.dcgm.snapshot()[1].values():
                if ":" not in r.gpu:
                    out[r.uuid] = (r.gpu, "dcgm")
        if self.sampler is not None:
            for gpu, *_ in self.sampler.snapshot():
                out[gpu.uuid] = (str(gpu.index), gpu.source)
        return out

    def tick(self):
        stopping = self.agent.stopping
        if self.sampler is not None:
            self.sampler.ensure_running(stopping)
        if self.dcgm is not None:
            self.dcgm.ensure_running(stopping)
        ranks = self.agent.table.snapshot()
        tracks = [(s[0], s[5]) for s in self.sampler.snapshot()] if self.sampler else []
        pods = {}
        if self.dcgm is not None:
            pods = {r.uuid: (r.namespace, r.pod) for r in self.dcgm.snapshot()[1].values()
                    if ":" not in r.gpu}
        new = mapping.build(ranks, tracks, pods)
        old, self.mapping = self.mapping, new
        live = {r.key for r in ranks}
        for key in set(old.gpu_of) - live:  # samples recorded after the rank expired
            self.agent.samples.drop_scope(key)
        known = self.gpus()
        with self.agent.table.lock:
            for r in ranks:
                info = self._rank_json(r.key, known)
                if info is None:
                    r.extra.pop("json_gpu", None)
                else:
                    r.extra["json_gpu"] = info

    def _rank_json(self, key, known):
        found = self.mapping.gpu_of.get(key)
        if found is None:
            return None
        uuid, via = found
        index, source = known.get(uuid, ("", ""))
        return {"uuid": uuid, "gpu": index, "source": source, "via": via}

    def timeline_part(self, rank, seconds):
        """The rank's GPU and its busy samples [t_end_ns, period_ns, ratio] (the periods
        vary: NVML's gap snapshots cover seconds)."""
        info = self._rank_json(rank.key, self.gpus())
        if info is None:
            return None
        busy = []
        if self.sampler is not None:
            with self.sampler.lock:
                track = self.sampler.tracks.get(info["uuid"])
                if track is not None:
                    busy = [list(s) for s in track.window(seconds)]
        info["busy"] = busy
        return info


def install(agent, nvml=None):
    """Add the GPU signals to ``agent`` (options from ``agent.config.options``)."""
    return GpuPart(agent, nvml=nvml).install()
