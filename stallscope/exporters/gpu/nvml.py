"""GPU busy samples from NVML (nvidia-ml-py, ``import pynvml``), at the driver's own rate.

``nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, last_ts)`` returns the samples
the driver buffered since ``last_ts`` (about 100, one every 1/6 s to 1 s): each is the
percentage of its sample period during which a kernel ran. Reading that buffer once a
second loses nothing, unlike ``nvmlDeviceGetUtilizationRates`` (one value per call).

Traps handled here, each seen in the field:
- ``NVMLError_NotFound`` means "nothing new since last_ts", not a failure.
- The driver stops adding samples while the GPU sits idle, so an idle GPU looks like a
  silent one (polarsignals/gpu-metrics-agent#37). A gap between two samples longer than
  the sample period is accounted as idle; after ``GAP_S`` without any sample the gap is
  filled from a ``nvmlDeviceGetUtilizationRates`` snapshot, so idle reads as 0 now.
- Sample timestamps are "CPU timestamps in µs" against an unspecified clock: the Unix
  epoch on some drivers, time since boot on others (polarsignals/gpu-metrics-agent#36).
  The clock is recognised per GPU by which of CLOCK_REALTIME / CLOCK_BOOTTIME /
  CLOCK_MONOTONIC the newest sample is a few seconds behind, then converted with that
  clock's offset to CLOCK_MONOTONIC, the clock of the hook's batch events.
- Unfilled buffer slots come back with timeStamp 0; order is not documented (sort);
  values outside 0..100 are garbage. The value's union member follows the returned type.
- ``NVMLError_NotSupported`` from GetSamples (vGPU, some MIG setups) falls back to
  ``nvmlDeviceGetUtilizationRates``; when that is unsupported too (MIG instances), the
  GPU is reported unsupported once. ``NVMLError_GpuIsLost`` stops reading that GPU.
"""
import importlib
import time

from .source import Gpu, GpuLost, ReadError, Unavailable, Unsupported

# The sample period is fixed per product, between 1/6 s and 1 s (nvml.h, on
# nvmlDeviceGetUtilizationRates); it is learnt as the smallest spacing between samples.
MIN_PERIOD_NS = 1_000_000_000 // 6
MAX_PERIOD_NS = 1_000_000_000
GAP_S = 2.0                     # no samples for this long: the GPU is idle, snapshot it
MAX_SAMPLE_AGE_NS = 600 * 10**9  # a buffered sample is at most ~100 s old; leave room
_CLOCKS = (("realtime", time.CLOCK_REALTIME), ("boottime", getattr(time, "CLOCK_BOOTTIME", None)),
           ("monotonic", time.CLOCK_MONOTONIC))


# nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0 ...) → the member of c_nvmlValue_t holding it.
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class _State:
    __slots__ = ("last_ts", "domain", "covered_ns", "mode", "period_ns")

    def __init__(self):
        self.last_ts = 0          # newest NVML timestamp seen (µs, NVML's clock)
        self.domain = None        # which clock NVML's timestamps are on
        self.covered_ns = None    # busy time is accounted up to here (CLOCK_MONOTONIC)
        self.mode = "samples"     # samples | rates
        self.period_ns = None     # the product's sample period (smallest spacing seen)


def clock_offsets():
    """(monotonic now, {clock: now_on_clock - monotonic now}) read back to back."""
    before = time.monotonic_ns()
    nows = {name: time.clock_gettime_ns(cid) for name, cid in _CLOCKS if cid is not None}
    after = time.monotonic_ns()
    mono = (before + after) // 2
    return mono, {name: now - mono for name, now in nows.items()}


def detect_domain(newest_ns, mono_now, offsets):
    """The clock on which ``newest_ns`` is a recent past instant, or None."""
    best = None
    for name, offset in offsets.items():
        lag = mono_now + offset - newest_ns
        if -10**9 <= lag <= MAX_SAMPLE_AGE_NS and (best is None or abs(lag) < best[0]):
            best = (abs(lag), name)
    return best and best[1]


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml=None):
        self.nvml = nvml  # a pynvml-like module; imported on open() when None
        self._gpus = []

    def open(self):
        if self.nvml is None:
            try:
                self.nvml = importlib.import_module("pynvml")
            except ImportError:
                raise Unavailable("nvidia-ml-py is not installed (pip install 'stallscope[gpu]')") from None
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError_LibraryNotFound:
            raise Unavailable("no NVIDIA driver on this node (libnvidia-ml.so.1 not found)") from None
        except nv.NVMLError_DriverNotLoaded:
            raise Unavailable("the NVIDIA driver is not loaded") from None
        except nv.NVMLError as e:
            raise Unavailable("nvmlInit failed: %s" % e) from e
        gpus = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    gpu = Gpu(i, nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetName(h), self.name, h)
                except nv.NVMLError:  # lost at enumeration: skip it, read the others
                    continue
                gpu.state = _State()
                gpus.append(gpu)
        except nv.NVMLError as e:
            self._shutdown()
            raise Unavailable("cannot list GPUs: %s" % e) from e
        if not gpus:
            self._shutdown()
            raise Unavailable("no readable NVIDIA GPU on this node")
        self._gpus = gpus

    def gpus(self):
        return self._gpus

    def _shutdown(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    def close(self):
        self._shutdown()

    def _fail(self, e):
        nv = self.nvml
        if isinstance(e, nv.NVMLError_GpuIsLost):
            return GpuLost(str(e))
        return ReadError(type(e).__name__)

    def read(self, gpu):
        nv, st = self.nvml, gpu.state
        if st.mode == "samples":
            try:
                vtype, raw = nv.nvmlDeviceGetSamples(gpu.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                                                     st.last_ts)
            except nv.NVMLError_NotFound:
                vtype, raw = None, ()
            except nv.NVMLError_NotSupported:
                st.mode = "rates"
            except nv.NVMLError as e:
                raise self._fail(e) from e
            else:
                out = self._convert(st, vtype, raw)
                if out:
                    return out
        now = time.monotonic_ns()
        if st.covered_ns is None:
            st.covered_ns = now  # the start of what this sampler accounts for
            return []
        if st.mode == "rates" or now - st.covered_ns > GAP_S * 1e9:
            return self._snapshot(gpu, now)
        return []

    def _convert(self, st, vtype, raw):
        field = _VALUE_FIELDS.get(vtype, "uiVal")
        points = []
        for s in raw:
            ts = s.timeStamp
            if ts == 0 or ts <= st.last_ts:  # an unfilled slot, or already seen
                continue
            v = getattr(s.sampleValue, field)
            if 0 <= v <= 100:
                points.append((ts, v))
        if not points:
            return []
        points.sort()
        mono, offsets = clock_offsets()
        newest_ns = points[-1][0] * 1000
        if st.domain is not None and st.domain != "anchored":
            lag = mono + offsets[st.domain] - newest_ns
            if not -10**9 <= lag <= MAX_SAMPLE_AGE_NS:
                st.domain = None  # the clock was stepped: recognise it again
        if st.domain is None:
            st.domain = detect_domain(newest_ns, mono, offsets) or "anchored"
        # "anchored": no known clock fits, so the newest sample is taken as "now".
        offset = newest_ns - mono if st.domain == "anchored" else offsets[st.domain]
        deltas = [(b[0] - a[0]) * 1000 for a, b in zip(points, points[1:])]
        if st.last_ts:
            deltas.append((points[0][0] - st.last_ts) * 1000)
        if deltas:
            seen = min(deltas) if st.period_ns is None else min(st.period_ns, *deltas)
            st.period_ns = min(max(seen, MIN_PERIOD_NS), MAX_PERIOD_NS)
        period = st.period_ns or MIN_PERIOD_NS
        out = []
        covered = st.covered_ns
        for ts, v in points:
            t = ts * 1000 - offset
            if covered is None:  # the first sample ever only marks where accounting starts
                covered = t
                continue
            if t <= covered:  # already accounted (by a gap snapshot)
                continue
            start = max(t - period, covered)
            if start - covered > period // 2:
                # The driver records nothing while the GPU is idle: the gap was idle.
                out.append((start, start - covered, 0.0))
            else:
                start = covered  # sampling jitter: the sample covers it
            out.append((t, t - start, v / 100.0))
            covered = t
        st.last_ts = points[-1][0]
        st.covered_ns = covered
        return out

    def _snapshot(self, gpu, now):
        nv, st = self.nvml, gpu.state
        try:
            util = nv.nvmlDeviceGetUtilizationRates(gpu.handle)
        except nv.NVMLError_NotSupported:
            if st.mode == "rates":
                raise Unsupported("neither utilisation samples nor rates are supported "
                                  "(a MIG instance or a vGPU)") from None
            return []
        except nv.NVMLError as e:
            raise self._fail(e) from e
        start, st.covered_ns = st.covered_ns, now
        if not 0 <= util.gpu <= 100:
            return []
        return [(now, now - start, util.gpu / 100.0)]

    def processes(self, gpu):
        nv = self.nvml
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
        except nv.NVMLError_NotSupported:
            return {}
        except nv.NVMLError as e:
            raise self._fail(e) from e
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}

