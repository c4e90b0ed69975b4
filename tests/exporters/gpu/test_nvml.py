"""NVML sampler against the fake pynvml (tests/helpers/fake_nvml.py: real error classes
and ctypes structures, driver-like buffers and clocks) and against the real pynvml on
this machine, which has no NVIDIA driver."""
import time

import pytest

from stallscope.exporters.gpu import nvml as nvml_mod
from stallscope.exporters.gpu.nvml import NvmlSource
from stallscope.exporters.gpu.source import Sampler, Unavailable

pynvml = pytest.importorskip("pynvml")  # the fake is built from the real module's classes
from tests.helpers.fake_nvml import FakeGpu, FakeNvml, constant, square  # noqa: E402

QUANT = 0.0051  # NVML reports whole percent


def sampler(fake, logs=None, **kw):
    logs = [] if logs is None else logs
    return Sampler(NvmlSource(fake), log=logs.append, **kw), logs


def expected_ratio(busy, t_end_ns, period_ns, offset_ns):
    """The fake's busy fraction over a sample's period, mapped back to the fake's clock."""
    t1 = (t_end_ns + offset_ns) / 1e9
    return busy(t1 - period_ns / 1e9, t1)


def test_real_pynvml_without_driver_is_unavailable_not_an_error():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: see tests/exporters/gpu/real_nvml_check.py")
    s, logs = sampler(None)
    for _ in range(3):
        s.poll()
    assert not s.available and "no NVIDIA driver" in s.reason
    assert logs == []  # the gpu exporter reports it, once (exporter framework)


@pytest.mark.parametrize("code,words", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
])
def test_init_errors_are_unavailable_and_retried_until_the_driver_appears(code, words):
    fake = FakeNvml([FakeGpu(0, busy=constant(0.5))], init_error=code)
    s, logs = sampler(fake, retry_s=0.0)
    s.poll()
    s.poll()
    assert not s.available and words in s.reason and fake.calls["nvmlInit"] == 2
    fake.init_error = None  # the GPU Operator's driver container finished installing
    s.poll()
    assert s.available and s.reason is None and len(s.tracks) == 1


def test_no_gpus_is_unavailable():
    with pytest.raises(Unavailable, match="no readable NVIDIA GPU"):
        NvmlSource(FakeNvml([])).open()


@pytest.mark.parametrize("clock", ["realtime", "boottime"])
def test_samples_are_on_the_monotonic_clock_and_match_the_busy_pattern(clock):
    busy = square(1.3, 0.4, phase_s=0.1)  # asymmetric: a shifted clock would not match
    # 20 s of history: the driver ring (100 slots) has wrapped, so reads come unsorted.
    fake = FakeNvml([FakeGpu(0, busy=busy, history_s=20.0)], clock=clock)
    s, _ = sampler(fake)
    s.poll()
    gpu = s.source.gpus()[0]
    assert gpu.state.domain == clock
    ring = list(s.tracks[gpu.uuid].ring)
    assert len(ring) > 60
    mono, offsets = nvml_mod.clock_offsets()
    ends = [t for t, _, _ in ring]
    assert ends == sorted(ends) and all(t <= mono + 10**6 for t in ends)
    for (t, _, _), (t_next, p_next, _) in zip(ring, ring[1:]):
        assert t_next - p_next == t  # contiguous: every instant accounted once
    for t, period, ratio in ring:
        assert ratio == pytest.approx(expected_ratio(busy, t, period, offsets[clock]), abs=QUANT)
    busy_s = sum(r * p for _, p, r in ring) / 1e9
    span = (ring[-1][0] - ring[0][0] + ring[0][1]) / 1e9
    assert busy_s / span == pytest.approx(0.4, abs=0.03)
    track = s.tracks[gpu.uuid]
    assert track.busy_seconds == pytest.approx(busy_s) and track.sampled_seconds == pytest.approx(span)


def test_nothing_new_is_not_an_error_and_an_idle_gpu_reads_zero(monkeypatch):
    monkeypatch.setattr(nvml_mod, "GAP_S", 0.2)
    fake = FakeNvml([FakeGpu(0, busy=constant(0.0))])  # idle: the driver records nothing
    s, logs = sampler(fake)
    s.poll()
    s.poll()
    track = s.tracks[fake.gpus[0].uuid]
    assert not track.ring and not s.errors and fake.calls["nvmlDeviceGetSamples"] == 2
    time.sleep(0.3)
    s.poll()
    (t, period, ratio), = track.ring
    assert ratio == 0.0 and period >= 0.2e9 and track.ratio == 0.0
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 1 and not s.errors and not logs


def test_samples_not_supported_falls_back_to_utilization_rates():
    fake = FakeNvml([FakeGpu(0, busy=constant(0.42), samples_supported=False)])
    s, logs = sampler(fake)
    s.poll()  # marks the start of accounting
    time.sleep(0.05)
    s.poll()
    track = s.tracks[fake.gpus[0].uuid]
    assert track.status == "ok" and track.ratio == pytest.approx(0.42, abs=QUANT)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 1 and not logs


def test_mig_instance_is_unsupported_once_and_other_gpus_keep_going():
    fake = FakeNvml([FakeGpu(0, mig=True), FakeGpu(1, busy=constant(1.0), history_s=3)])
    s, logs = sampler(fake)
    for _ in range(3):
        s.poll()
    mig, full = (s.tracks[g.uuid] for g in fake.gpus)
    assert mig.status == "unsupported" and full.status == "ok" and full.ratio == 1.0
    assert len([m for m in logs if "no utilisation reading" in m]) == 1


def test_lost_gpu_stops_being_read_and_reads_down():
    fake = FakeNvml([FakeGpu(0, busy=constant(0.3), history_s=3),
                     FakeGpu(1, busy=constant(0.6), history_s=3)])
    s, logs = sampler(fake)
    s.poll()
    fake.gpus[0].lost = True  # XID 79: fell off the bus
    s.poll()
    s.poll()
    snap = {g.uuid: status for g, status, *_ in s.snapshot()}
    assert snap == {fake.gpus[0].uuid: "lost", fake.gpus[1].uuid: "ok"}
    assert len([m for m in logs if "is lost" in m]) == 1
    calls = fake.calls["nvmlDeviceGetSamples"]
    s.poll()
    assert fake.calls["nvmlDeviceGetSamples"] == calls + 1  # only the healthy GPU


def test_a_failed_read_is_counted_and_the_next_one_works():
    fake = FakeNvml([FakeGpu(0, busy=constant(0.5), history_s=3)])
    s, _ = sampler(fake)
    fake.fail("nvmlDeviceGetSamples", pynvml.NVML_ERROR_UNKNOWN)
    s.poll()
    assert s.errors == {"NVMLError_Unknown": 1}
    s.poll()
    assert s.tracks[fake.gpus[0].uuid].ratio == 0.5


def test_compute_processes_are_host_pids_with_memory():
    fake = FakeNvml([FakeGpu(0, processes=[(4242, 71 << 30), (4343, 512 << 20)])])
    s, _ = sampler(fake)
    s.poll()
    assert s.tracks[fake.gpus[0].uuid].pids == {4242: 71 << 30, 4343: 512 << 20}


def test_the_ring_is_bounded():
    fake = FakeNvml([FakeGpu(0, busy=constant(0.9), history_s=15)])
    s, _ = sampler(fake, ring_size=10)
    s.poll()
    track = s.tracks[fake.gpus[0].uuid]
    assert len(track.ring) == 10 and track.sampled_seconds > 5


def test_garbage_values_and_unknown_clocks_are_tolerated():
    fake = FakeNvml([FakeGpu(0, busy=constant(0.25), history_s=3)])
    src = NvmlSource(fake)
    src.open()
    gpu = src.gpus()[0]
    S = pynvml.c_nvmlSample_t
    far = 10**15  # on no clock this agent knows: anchored to "now"
    raw = [S(timeStamp=far, sampleValue=pynvml.c_nvmlValue_t(uiVal=30)),
           S(timeStamp=far + 166_667, sampleValue=pynvml.c_nvmlValue_t(uiVal=250)),
           S(timeStamp=far + 333_333, sampleValue=pynvml.c_nvmlValue_t(uiVal=40))]
    out = src._convert(gpu.state, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, raw)
    assert gpu.state.domain == "anchored"
    assert [r for _, _, r in out] == [0.4]  # the first only starts accounting; 250 % dropped
    assert abs(out[0][0] - time.monotonic_ns()) < 10**9
