"""Exporter ``gpu``: the GPU signals as one part, configured by the ``--gpu.*`` flags
(options.py):

- a ``Sampler`` over NVML (``--gpu.nvml``, default on) and, with ``--gpu.simulated``,
  one over the simulated GPU; a ``DcgmReader`` when ``--gpu.dcgm-url`` is given. Each
  runs in its own thread, so a hung driver call never stalls a collection or a scrape;
- the hook's CUDA device report (``"cuda"`` in a report, validated here), and for the
  simulated GPU the batch events of every report;
- the GPU <-> rank map (mapping.py), refreshed at each collection;
- samples into the SampleStore: scope ``("gpu", uuid)`` and, for a mapped rank, the
  rank's key, with signals ``gpu_busy_ratio`` (NVML or simulated) and
  ``gpu_sm_active_ratio`` (dcgm-exporter), values in [0, 1] at each sample's end time;
- ``gpu`` in a rank's /api/v1/ranks entry and its /api/v1/timeline, and the rank's GPU
  as a ``RankGpu`` fact on the host (host/facts.py) for the other parts.
"""
from __future__ import annotations

import collections
import re
import threading
from typing import Any

from ...host.facts import RankGpu
from ...host.report import HookReport
from ...vocabulary import signal
from ..base import Exporter
from . import collector, mapping
from .dcgm import DcgmReader
from .nvml import NvmlSource
from .options import GpuOptions
from .sim import SimulatedSource, sim_uuid
from .source import Sampler

BUSY = signal("gpu_busy_ratio").name
SM_ACTIVE = signal("gpu_sm_active_ratio").name

_UUID_RE = re.compile(r"^[A-Za-z0-9-]{1,96}$")


class GpuExporter(Exporter):
    name = "gpu"
    Options = GpuOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        o = self.options
        self.samples = host.samples
        self.rejected: collections.Counter[str] = collections.Counter()
        self.devices: dict[Any, dict[str, Any]] = {}   # rank key -> the hook's CUDA device
        self.info: dict[Any, dict[str, Any]] = {}      # rank key -> its GPU, for the API
        self.mapping = mapping.Mapping()
        # held while a rank's GPU samples are recorded and while the map changes: a
        # sample read under the old map must not land after the change dropped its like
        self.mapping_lock = threading.Lock()
        self.interval_s = o.sample_interval
        self.simulate = o.simulated
        self.samplers = []
        if o.nvml:
            self.samplers.append(Sampler(NvmlSource(o.nvml_module), interval=self.interval_s,
                                         on_samples=self._on_samples, log=self.note))
        self.sim = None
        if self.simulate:
            self.note("source: SIMULATED (--gpu.simulated): a simulated GPU per rank, its series "
                      "and reports labelled source=\"simulated\"")
            self.sim = SimulatedSource(host)
            # Read as often as NVML would be: the simulation has news only when a
            # trainer's report comes (once a second), and every read of every rank's
            # GPU costs the agent whether or not it has (issue 15).
            self.samplers.append(Sampler(self.sim, interval=self.interval_s,
                                         on_samples=self._on_samples, log=self.note))
        self.dcgm = None
        if o.dcgm_url:
            every = o.dcgm_interval
            self.dcgm = DcgmReader(o.dcgm_url, interval=every, timeout=min(2.0, max(0.5, every)),
                                   on_readings=self._on_readings, log=self.note)

    def start(self):
        for s in self.samplers:
            s.ensure_running(self.host.stopping)
        if self.dcgm is not None:
            self.dcgm.ensure_running(self.host.stopping)

    def handle(self, report: HookReport, rank: Any) -> None:
        if not report.main:
            return
        if self.sim is not None and len(report.events):
            self.sim.feed(rank.key, report.events)  # its (n, 3) rows: kept as they are
            if self.host.facts.get(RankGpu, rank.key) is None:
                # known from the first report on: its own simulated GPU (sim.py), so a
                # part that needs the rank's GPU has it before any collection (issue 29)
                self.host.facts.publish(self.name, rank.key, RankGpu(
                    sim_uuid(rank.key), "", "simulated", "simulated"))
        cuda = report.raw.get("cuda")
        if cuda is None:
            return
        index = cuda.get("index") if isinstance(cuda, dict) else None
        uuid = cuda.get("uuid") if isinstance(cuda, dict) else None
        if (type(index) is not int or not 0 <= index < 4096 or not isinstance(uuid, str)
                or not _UUID_RE.match(uuid)):
            with self.lock:
                self.rejected["bad_cuda"] += 1
            return
        self.devices[rank.key] = {"index": index, "uuid": uuid}

    def forget(self, key: Any) -> None:
        self.devices.pop(key, None)
        self.info.pop(key, None)
        if self.sim is not None:
            self.sim.forget(key)

    # -- sinks (sampler and reader threads) ---------------------------------------------
    def _on_samples(self, gpu, samples):
        # a read's samples at once: one ring append per scope, not one per sample
        t = [s[0] for s in samples]
        ratio = [s[2] for s in samples]
        self.samples.record_many(("gpu", gpu.uuid), BUSY, t, ratio)
        with self.mapping_lock:
            for key in self.mapping.ranks_of.get(gpu.uuid, ()):
                self.samples.record_many(key, BUSY, t, ratio)

    def _on_readings(self, readings, t_ns):
        record = self.samples.record
        for r in readings.values():
            instance = r.gpu.partition(":")[2]
            scope = ("gpu", r.uuid + (":" + instance if instance else ""))
            record(scope, SM_ACTIVE, r.value, t_ns)
            if not instance:
                with self.mapping_lock:
                    for key in self.mapping.ranks_of.get(r.uuid, ()):
                        record(key, SM_ACTIVE, r.value, t_ns)

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
        """Rebuild the GPU <-> rank map and each rank's GPU for the API."""
        pods = {r.uuid: (r.namespace, r.pod) for r in self.readings().values() if ":" not in r.gpu}
        new = mapping.build(ranks, [(t[0], t[5]) for t in self.tracks()], pods, self.devices)
        live = {r.key for r in ranks}
        with self.mapping_lock:
            old, self.mapping = self.mapping, new
            for key in set(old.gpu_of) - live:  # samples recorded after the rank expired
                self.samples.drop_scope(key)
            # A rank mapped to one GPU on weaker evidence until better came (its first
            # report handled after a collection saw the rank; NVML's process list before
            # the hook's CUDA device): its series so far are another GPU's, not its own.
            for key, (uuid, _via) in new.gpu_of.items():
                was = old.gpu_of.get(key)
                if was is not None and was[0] != uuid:
                    self.samples.drop(key, (BUSY, SM_ACTIVE))
        known = self.gpus()
        self.info = {r.key: info for r in ranks
                     for info in [self._rank_json(r.key, known)] if info is not None}
        # the rank's GPU as a fact on the host (host/facts.py): a rank no longer mapped keeps
        # its last one, dated, until it leaves the table
        for key, info in self.info.items():
            self.host.facts.publish(self.name, key, RankGpu(info["uuid"], info["gpu"], info["source"],
                                                            info["via"]))

    def _rank_json(self, key, known):
        found = self.mapping.gpu_of.get(key)
        if found is None:
            return None
        uuid, via = found
        index, source = known.get(uuid, ("", ""))
        return {"uuid": uuid, "gpu": index, "source": source, "via": via}

    def rank_fields(self, rank: Any) -> dict[str, Any]:
        info = self.info.get(rank.key)
        return {"gpu": info} if info is not None else {}

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

    def collect(self) -> Any:
        self.start()
        ranks = self.host.ranks()
        self.refresh(ranks)
        return collector.families(self, ranks)

    def timeline_fields(self, rank: Any, seconds: float) -> dict[str, Any]:
        """The rank's GPU and its busy samples [t_end_ns, period_ns, ratio] (the periods
        vary: NVML's gap snapshots cover seconds)."""
        info = self._rank_json(rank.key, self.gpus())
        if info is None:
            return {}
        busy = []
        for s in self.samplers:
            with s.lock:
                track = s.tracks.get(info["uuid"])
                if track is not None:
                    busy = [list(x) for x in track.window(seconds)]
        info["busy"] = busy
        return {"gpu": info}
