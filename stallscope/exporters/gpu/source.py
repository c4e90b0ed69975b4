"""The sampler interface every GPU source implements, and the thread that drives one.

A source (nvml.NvmlSource, sim.SimulatedSource) has:
- ``name``: the ``source`` label of its series ("nvml", "simulated")
- ``open()``: prepare; raises ``Unavailable(reason)`` when this node cannot be read
- ``gpus()``: the GPUs to read now (fixed for NVML; one per live rank for the simulation)
- ``read(gpu)``: new samples since the last call, oldest first, as
  ``(t_end_ns, period_ns, busy_ratio)`` on CLOCK_MONOTONIC; raises ``GpuLost`` or
  ``Unsupported`` for that GPU, ``ReadError`` for a failed read worth counting
- ``processes(gpu)``: ``{pid: used_bytes}`` of compute processes (host PIDs), or {}
- ``close()``

The ``Sampler`` keeps a bounded ring of samples and a busy-seconds counter per GPU, so a
slow scrape still sees every on/off pattern through ``rate()``.
"""
import collections
import sys
import threading
import time

import numpy as np

from ...host.rings import Ring

RING_SIZE = 4096  # ~11 minutes at NVML's fastest period (1/6 s), ~7 at the simulation's
SAMPLE_BYTES = 24  # a sample in the ring: int64 time and period, float64 ratio
PROCESS_REFRESH_S = 5.0


class Unavailable(Exception):
    """This node cannot be read by this source (no driver, no GPU, no library)."""


class GpuLost(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST): stop reading it."""


class Unsupported(Exception):
    """This GPU has no utilisation reading (MIG instances, some vGPUs)."""


class ReadError(Exception):
    """One read failed; ``reason`` is a short fixed string (a counter label)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Gpu:
    __slots__ = ("index", "uuid", "name", "source", "handle", "rank_key", "state")

    def __init__(self, index, uuid, name, source, handle=None, rank_key=None):
        self.index = index
        self.uuid = uuid
        self.name = name
        self.source = source
        self.handle = handle        # the source's own handle (NVML device)
        self.rank_key = rank_key    # the simulated GPU's rank, by construction
        self.state = None           # the source's per-GPU reading state


class SampleRing:
    """A GPU's newest (t_end_ns, period_ns, busy_ratio) samples, in arrays allocated (and
    committed) once: as a deque of tuples the ring held ~130 bytes of Python objects a
    sample and filled for its first 7-11 minutes, a slow rise of the agent's RSS
    under the soak (issue 14); here it is RING_SIZE x SAMPLE_BYTES from the first read."""

    __slots__ = ("times", "ratios")

    def __init__(self, capacity):
        self.times = Ring(capacity, 2, np.int64)
        self.ratios = Ring(capacity, 1, np.float64)

    def __len__(self):
        return len(self.times)

    def extend(self, samples):
        self.times.extend(np.array([(t, p) for t, p, _ in samples], np.int64).reshape(-1, 2))
        self.ratios.extend(np.array([r for _, _, r in samples], np.float64).reshape(-1, 1))

    def since(self, horizon_ns):
        k = self.times.first_at(horizon_ns)  # a GPU's samples come in time order
        times, ratios = self.times.tail(k), self.ratios.tail(k)[:, 0]
        return list(zip(*(times.T.tolist()), ratios.tolist()))

    def __iter__(self):
        return iter(self.since(-(1 << 63)))


class GpuTrack:
    """What the sampler knows about one GPU: the ring, the counters, the last level."""

    __slots__ = ("gpu", "ring", "busy_seconds", "sampled_seconds", "ratio", "last_t_ns",
                 "status", "pids")

    def __init__(self, gpu, ring_size=RING_SIZE):
        self.gpu = gpu
        self.ring = SampleRing(ring_size)
        self.busy_seconds = 0.0     # integral of busy over sampled time
        self.sampled_seconds = 0.0  # time covered by samples
        self.ratio = None           # busy share of the newest batch of samples
        self.last_t_ns = None
        self.status = "ok"          # ok | lost | unsupported
        self.pids = {}              # host PID -> GPU memory bytes (compute processes)

    def add(self, samples):
        busy = span = 0.0
        self.ring.extend(samples)
        for _t, period, ratio in samples:
            busy += ratio * period
            span += period
        if span:
            self.busy_seconds += busy / 1e9
            self.sampled_seconds += span / 1e9
            self.ratio = busy / span
            self.last_t_ns = samples[-1][0]

    def window(self, seconds, now_ns=None):
        """Samples whose period ended in the last ``seconds``."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        return self.ring.since(now_ns - int(seconds * 1e9))


def _log(message):
    print("stallscope agent: gpu: %s" % message, file=sys.stderr, flush=True)


class Sampler:
    """Drives one source: opens it (retrying while it is unavailable, e.g. while the GPU
    Operator's driver container is still installing; ``reason`` says why), reads every
    GPU each ``interval`` and hands new samples to ``on_samples(gpu, samples)``. Lost
    and unsupported GPUs are logged once."""

    def __init__(self, source, interval=1.0, retry_s=60.0, on_samples=None, log=_log,
                 ring_size=RING_SIZE):
        self.source = source
        self.interval = interval
        self.retry_s = retry_s
        self.on_samples = on_samples
        self.log = log
        self.ring_size = ring_size
        self.lock = threading.Lock()
        self.tracks = {}            # uuid -> GpuTrack
        self.errors = collections.Counter()
        self.opened = False
        self.reason = None          # why the source is unavailable, or None
        self.retry_at = 0.0
        self.next_procs = 0.0
        self.polls = 0
        self.thread = None
        self._said = set()

    def say_once(self, message):
        if message not in self._said:
            self._said.add(message)
            self.log(message)

    @property
    def available(self):
        return self.opened

    def poll(self):
        """One cycle: open if needed, read each GPU. Never raises."""
        now = time.monotonic()
        if not self.opened:
            if now < self.retry_at:
                return
            try:
                self.source.open()
            except Unavailable as e:  # reported by whoever drives the sampler
                self.reason = str(e)
                self.retry_at = now + self.retry_s
                return
            except Exception as e:  # a broken driver stack must not kill the agent
                self.reason = "%s: %s" % (type(e).__name__, e)
                self.retry_at = now + self.retry_s
                return
            self.opened, self.reason = True, None
        try:
            gpus = self.source.gpus()
        except Exception as e:
            self.errors["gpus_" + type(e).__name__] += 1
            return
        refresh_procs = now >= self.next_procs
        if refresh_procs:
            self.next_procs = now + PROCESS_REFRESH_S
        seen = set()
        for gpu in gpus:
            seen.add(gpu.uuid)
            track = self.tracks.get(gpu.uuid)
            if track is None:
                with self.lock:
                    track = self.tracks[gpu.uuid] = GpuTrack(gpu, self.ring_size)
            if track.status != "ok":
                continue
            self._read(track, refresh_procs)
        if len(seen) != len(self.tracks):
            with self.lock:  # GPUs the source no longer lists (a simulated rank left)
                for uuid in [u for u in self.tracks if u not in seen]:
                    del self.tracks[uuid]
        self.polls += 1

    def _read(self, track, refresh_procs):
        gpu = track.gpu
        try:
            samples = self.source.read(gpu)
            if refresh_procs:
                track.pids = self.source.processes(gpu)
        except GpuLost as e:
            track.status = "lost"
            track.ratio = None
            self.say_once("GPU %s (%s) is lost, no longer read: %s" % (gpu.index, gpu.uuid, e))
            return
        except Unsupported as e:
            track.status = "unsupported"
            self.say_once("GPU %s (%s) has no utilisation reading: %s" % (gpu.index, gpu.uuid, e))
            return
        except ReadError as e:
            self.errors[e.reason] += 1
            return
        except Exception as e:
            self.errors[type(e).__name__] += 1
            return
        if samples:
            with self.lock:
                track.add(samples)
            if self.on_samples is not None:
                try:
                    self.on_samples(gpu, samples)
                except Exception as e:
                    self.errors["sink_" + type(e).__name__] += 1

    def snapshot(self):
        """[(gpu, status, ratio, busy_seconds, sampled_seconds, pids)] for the collector."""
        with self.lock:
            return [(t.gpu, t.status, t.ratio, t.busy_seconds, t.sampled_seconds, dict(t.pids))
                    for t in self.tracks.values()]

    def run(self, stopping):
        while not stopping.is_set():
            started = time.monotonic()
            try:
                self.poll()
            except Exception as e:  # keep sampling: the next cycle may succeed
                self.errors["poll_" + type(e).__name__] += 1
            stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))
        try:
            if self.opened:
                self.source.close()
        except Exception:
            pass

    def ensure_running(self, stopping):
        """Start the sampling thread (again, should it have died)."""
        if not stopping.is_set() and (self.thread is None or not self.thread.is_alive()):
            self.thread = threading.Thread(target=self.run, args=(stopping,),
                                           name="stallscope-gpu-%s" % self.source.name, daemon=True)
            self.thread.start()
