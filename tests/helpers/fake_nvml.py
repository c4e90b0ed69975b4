"""A scriptable stand-in for the ``pynvml`` module (nvidia-ml-py), for tests and
benchmarks on machines without an NVIDIA GPU. A test double: it lives under tests/ and
the agent never imports it (tests hand it over as the ``gpu_nvml_module`` option).

It is built from the real module: the error classes (``NVMLError`` and its per-code
subclasses, so ``except pynvml.NVMLError_NotFound`` behaves as with a driver), the
constants and the ctypes structures (``c_nvmlSample_t``, ``c_nvmlUtilization_t``,
``c_nvmlDevice_t`` handles, ``nvmlFriendlyObject`` process entries) are the real ones;
only the functions that would call libnvidia-ml.so are replaced. The device behaves
like the driver as documented in nvml.h and as observed in the field:

- a ring of the last 100 utilisation samples, one per ``period_s`` (1/6 s when busy),
  each the percentage of its period during which "kernels ran" (``busy(t0, t1)``);
- timestamps in µs on ``clock`` ("realtime": Unix epoch, or "boottime": since boot,
  as drivers differ); samples newer than ``last_ts`` only, ``NVMLError_NotFound`` when
  there are none; the first read of a fresh buffer carries an unfilled slot (timeStamp
  0) and reads come back in ring order, not sorted;
- no samples at all while the GPU is idle (the driver stops sampling);
- ``nvmlInit`` fails with LibraryNotFound / DriverNotLoaded when told; calls before
  ``nvmlInit`` raise Uninitialized; a lost GPU raises GpuIsLost on every call; MIG-like
  devices raise NotSupported for samples and rates.
"""
import collections
import ctypes
import time
import types

import pynvml as _real

RING = 100


def constant(ratio):
    return lambda t0, t1: ratio


def square(period_s, duty, phase_s=0.0):
    """Busy for the first ``duty`` of every ``period_s`` (seconds on the fake's clock);
    returns the exact busy fraction of any interval."""
    on = period_s * duty

    def busy_until(t):
        k, r = divmod(t - phase_s, period_s)
        return k * on + min(r, on)

    return lambda t0, t1: (busy_until(t1) - busy_until(t0)) / (t1 - t0) if t1 > t0 else 0.0


class FakeGpu:
    def __init__(self, index, uuid=None, name="NVIDIA H100 80GB HBM3", busy=None,
                 period_s=1 / 6, processes=None, mig=False, samples_supported=True,
                 idle_stops_sampling=True, history_s=2.0, bus_id=None, numa_node=-1, cpus=()):
        self.index = index
        # placement as NVML spells it: an 8-digit PCI domain, the NUMA node, the CPU affinity
        self.bus_id = bus_id or "00000000:%02X:00.0" % (0xA0 + index)
        self.numa_node = numa_node
        self.cpus = tuple(cpus)
        self.uuid = uuid or "GPU-%08x-1c2d-4e5f-8a9b-%012x" % (0x3ee8a7b0 + index, 0xc0ffee + index)
        self.name = name
        self.busy = busy or constant(0.0)
        self.period_us = int(period_s * 1e6)
        self.processes = processes or []  # [(pid, used_bytes)]
        self.mig = mig
        self.samples_supported = samples_supported and not mig
        self.idle_stops_sampling = idle_stops_sampling
        self.history_us = int(history_s * 1e6)
        self.lost = False
        self.ring = [None] * RING  # driver ring: (ts_us, percent), written round-robin
        self.written = 0
        self.next_ts = None
        self.handle_struct = _real.struct_c_nvmlDevice_t()


class FakeNvml:
    """Pass an instance wherever the ``pynvml`` module is expected."""

    def __init__(self, gpus=(), init_error=None, clock="realtime"):
        for name in dir(_real):  # errors, constants, structures: the real ones
            if name.startswith(("NVML", "c_nvml", "nvmlFriendly")):
                setattr(self, name, getattr(_real, name))
        self.gpus = list(gpus)
        self.init_error = init_error  # e.g. NVML_ERROR_LIBRARY_NOT_FOUND
        self.clock = {"realtime": time.CLOCK_REALTIME, "boottime": time.CLOCK_BOOTTIME}[clock]
        self.initialised = 0
        self.calls = collections.Counter()
        self.inject = {}  # function name -> [error code, remaining count]

    # -- scripting -----------------------------------------------------------------------
    def fail(self, fn, code, times=1):
        """Make the next ``times`` calls of ``fn`` raise NVMLError(code)."""
        self.inject[fn] = [code, times]

    def now_us(self):
        return time.clock_gettime_ns(self.clock) // 1000

    # -- internals -----------------------------------------------------------------------
    def _enter(self, fn, handle=None):
        self.calls[fn] += 1
        inj = self.inject.get(fn)
        if inj and inj[1] > 0:
            inj[1] -= 1
            raise _real.NVMLError(inj[0])
        if not self.initialised and fn not in ("nvmlInit", "nvmlShutdown"):
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            gpu = self._gpu(handle)
            if gpu.lost:
                raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
            return gpu
        return None

    def _gpu(self, handle):
        addr = ctypes.addressof(handle.contents)
        for g in self.gpus:
            if ctypes.addressof(g.handle_struct) == addr:
                return g
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)

    def _advance(self, g):
        now = self.now_us()
        if g.next_ts is None:
            g.next_ts = now - g.history_us
        p = g.period_us
        while g.next_ts + p <= now:
            t0, t1 = g.next_ts, g.next_ts + p
            g.next_ts = t1
            frac = g.busy(t0 / 1e6, t1 / 1e6)
            if frac <= 0 and g.idle_stops_sampling:
                continue
            g.ring[g.written % RING] = (t1, int(round(100 * frac)))
            g.written += 1

    # -- the pynvml API --------------------------------------------------------------------
    def nvmlInit(self):
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        if not self.initialised:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[index]
        if g.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        return _real.c_nvmlDevice_t(g.handle_struct)

    def nvmlDeviceGetUUID(self, handle):
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle):
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetIndex(self, handle):
        return self._enter("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetPciInfo(self, handle):
        g = self._enter("nvmlDeviceGetPciInfo", handle)
        return types.SimpleNamespace(busId=g.bus_id.encode())  # the binding's c_char array reads as bytes

    def nvmlDeviceGetNumaNodeId(self, handle):
        g = self._enter("nvmlDeviceGetNumaNodeId", handle)
        if g.numa_node < 0:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return g.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle, words):
        g = self._enter("nvmlDeviceGetCpuAffinity", handle)
        out = [0] * words
        for c in g.cpus:
            if c // 64 < words:
                out[c // 64] |= 1 << (c % 64)
        return out

    def nvmlDeviceGetSamples(self, handle, sampling_type, last_ts):
        g = self._enter("nvmlDeviceGetSamples", handle)
        if sampling_type != _real.NVML_GPU_UTILIZATION_SAMPLES or not g.samples_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        self._advance(g)
        # Ring order from the oldest slot: sorted until the ring wraps, rotated after.
        start = g.written % RING if g.written >= RING else 0
        slots = g.ring[start:] + g.ring[:start]
        picked = [s for s in slots if s is not None and s[0] > last_ts]
        if last_ts == 0 and g.written < RING:
            picked.insert(0, (0, 0))  # an unfilled slot of a fresh buffer
        if not picked or all(ts == 0 for ts, _ in picked):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        arr = (_real.c_nvmlSample_t * len(picked))()
        for i, (ts, pct) in enumerate(picked):
            arr[i].timeStamp = ts
            arr[i].sampleValue.uiVal = pct
        return (_real.NVML_VALUE_TYPE_UNSIGNED_INT, arr[0:len(picked)])

    def nvmlDeviceGetUtilizationRates(self, handle):
        g = self._enter("nvmlDeviceGetUtilizationRates", handle)
        if g.mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        now = self.now_us() / 1e6
        pct = int(round(100 * g.busy(now - g.period_us / 1e6, now)))
        return _real.c_nvmlUtilization_t(gpu=pct, memory=pct // 2)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        g = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        no_instance = 0xFFFFFFFF  # NVML's "not a MIG instance" id
        return [_real.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used,
                                          "gpuInstanceId": no_instance,
                                          "computeInstanceId": no_instance})
                for pid, used in g.processes]
