"""The GPU signals as one unit of the agent, run by the ``gpu`` exporter
(stallscope/exporters/gpu.py) and configured by the ``--gpu.*`` flags (options.py):

- a ``Sampler`` over NVML (``--gpu.nvml``, default on) and, with ``--gpu.simulated``,
  one over the simulated GPU; a ``DcgmReader`` when ``--gpu.dcgm-url`` is given. Each
  runs in its own thread, so a hung driver call never stalls a collection or a scrape;
- the hook's CUDA device report (``"cuda"`` in a report, validated here);
- the GPU <-> rank map (mapping.py), refreshed at each collection;
- samples into the SampleStore: scope ``("gpu", uuid)`` and, for a mapped rank, the
  rank's key, with signals ``gpu_busy_ratio`` (NVML or simulated) and
  ``gpu_sm_active_ratio`` (dcgm-exporter), values in [0, 1] at each sample's end time;
- rank extras: ``json_gpu`` (in /api/v1/ranks), ``gpu_source`` and ``gpu_uuid`` (for the
  correlator); ``"gpu"`` in /api/v1/timeline.
"""
import collections
import re

from . import collector, mapping
from .dcgm import DcgmReader
from .nvml import NvmlSource
from .sim import SimulatedSource
from .source import Sampler

_UUID_RE = re.compile(r"^[A-Za-z0-9-]{1,96}$")


class GpuPart:
    def __init__(self, options, node, samples, log, lock=None):
        self.node = node
        self.samples = samples
        self.log = log
        self.lock = lock            # the rank table's lock (rank.extra)
        self.stopping = None        # the agent's, set by attach()
        self.rejected = collections.Counter()
        self.mapping = mapping.Mapping()
        self.interval = options.get("gpu_sample_interval") or 1.0
        self.simulate = bool(options.get("gpu_simulated"))
        self.samplers = []
        if options.get("gpu_nvml", True):
            # gpu_nvml_module: a pynvml stand-in (tests, benchmarks); not a CLI flag.
            self.samplers.append(Sampler(NvmlSource(options.get("gpu_nvml_module")),
                                         interval=self.interval, on_samples=self._on_samples,
                                         log=log))
        self.dcgm = None
        url = options.get("gpu_dcgm_url")
        if url:
            every = options.get("gpu_dcgm_interval") or 1.0
            self.dcgm = DcgmReader(url, interval=every, timeout=min(2.0, max(0.5, every)),
                                   on_readings=self._on_readings, log=log)

    def attach(self, agent):
        """What needs the agent itself: the hook handler, the timeline part, the rank table
        for the simulation, the agent's stop event for the threads."""
        self.stopping = agent.stopping
        self.lock = agent.table.lock
        agent.table.handlers.append(self.on_message)
        agent.add_timeline_part("gpu", self.timeline_part)
        if self.simulate:
            self.log("source: SIMULATED (--gpu.simulated): a simulated GPU per rank, its "
                     "series and reports labelled source=\"simulated\"")
            self.samplers.append(Sampler(SimulatedSource(agent.table),
                                         interval=min(self.interval, 0.5),
                                         on_samples=self._on_samples, log=self.log))
        return self

    def start(self):
        if self.stopping is None:
            return
        for s in self.samplers:
            s.ensure_running(self.stopping)
        if self.dcgm is not None:
            self.dcgm.ensure_running(self.stopping)

    def unavailable(self):
        """Why no GPU signal can be read here, or None (also while still finding out)."""
        self.start()
        reasons = []
        for s in self.samplers:
            if s.available or s.reason is None:
                return None
            reasons.append("%s: %s" % (s.source.name, s.reason))
        if self.dcgm is not None:
            if self.dcgm.up or self.dcgm.errors.total() == 0:
                return None
            reasons.append("dcgm: %s" % self.dcgm.reason)
        return "; ".join(reasons) or "every GPU source is switched off (--no-gpu.nvml)"

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
        record = self.samples.record
        scope = ("gpu", gpu.uuid)
        for t, _period, ratio in samples:
            record(scope, "gpu_busy_ratio", ratio, t)
        for key in self.mapping.ranks_of.get(gpu.uuid, ()):
            for t, _period, ratio in samples:
                record(key, "gpu_busy_ratio", ratio, t)

    def _on_readings(self, readings, t_ns):
        record = self.samples.record
        for r in readings.values():
            instance = r.gpu.partition(":")[2]
            scope = ("gpu", r.uuid + (":" + instance if instance else ""))
            record(scope, "gpu_sm_active_ratio", r.value, t_ns)
            if not instance:
                for key in self.mapping.ranks_of.get(r.uuid, ()):
                    record(key, "gpu_sm_active_ratio", r.value, t_ns)

    # -- each collection ----------------------------------------------------------------
    def tracks(self):
        """[(gpu, status, ratio, busy_seconds, sampled_seconds, pids)] of every sampler."""
        return [t for s in self.samplers for t in s.snapshot()]

    def readings(self):
        return self.dcgm.snapshot()[1] if self.dcgm is not None else {}

    def gpus(self):
        """{uuid: (index label, source)} of every GPU a sampler or dcgm-exporter knows."""
        out = {r.uuid: (r.gpu, "dcgm") for r in self.readings().values() if ":" not in r.gpu}
        out.update((g.uuid, (str(g.index), g.source)) for g, *_ in self.tracks())
        return out

    def refresh(self, ranks):
        """Rebuild the GPU <-> rank map and the ranks' GPU extras."""
        pods = {r.uuid: (r.namespace, r.pod) for r in self.readings().values() if ":" not in r.gpu}
        new = mapping.build(ranks, [(t[0], t[5]) for t in self.tracks()], pods)
        old, self.mapping = self.mapping, new
        live = {r.key for r in ranks}
        for key in set(old.gpu_of) - live:  # samples recorded after the rank expired
            self.samples.drop_scope(key)
        known = self.gpus()
        with self.lock:
            for r in ranks:
                info = self._rank_json(r.key, known)
                if info is None:
                    for k in ("json_gpu", "gpu_source", "gpu_uuid"):
                        r.extra.pop(k, None)
                else:
                    r.extra.update(json_gpu=info, gpu_source=info["source"], gpu_uuid=info["uuid"])

    def _rank_json(self, key, known):
        found = self.mapping.gpu_of.get(key)
        if found is None:
            return None
        uuid, via = found
        index, source = known.get(uuid, ("", ""))
        return {"uuid": uuid, "gpu": index, "source": source, "via": via}

    def families(self, ranks):
        return collector.families(self, ranks)

    def timeline_part(self, rank, seconds):
        """The rank's GPU and its busy samples [t_end_ns, period_ns, ratio] (the periods
        vary: NVML's gap snapshots cover seconds)."""
        info = self._rank_json(rank.key, self.gpus())
        if info is None:
            return None
        busy = []
        for s in self.samplers:
            with s.lock:
                track = s.tracks.get(info["uuid"])
                if track is not None:
                    busy = [list(x) for x in track.window(seconds)]
        info["busy"] = busy
        return info
