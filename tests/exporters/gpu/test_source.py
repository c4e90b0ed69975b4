"""The sampler's per-GPU ring (source.py): its bytes are fixed when the GPU is first
seen, however long it is read (issue 14: a deque of tuples grew the agent's RSS for the
ring's first 7-11 minutes, at ~130 bytes a sample)."""
import tracemalloc

from stallscope.agent.table.budget import GPU_RING, GPU_SAMPLE_BYTES
from stallscope.exporters.gpu import source
from stallscope.exporters.gpu.source import RING_SIZE, SAMPLE_BYTES, Gpu, GpuTrack

PERIOD = 100_000_000


def samples(start, n):
    return [(start + (k + 1) * PERIOD, PERIOD, (k % 10) / 10) for k in range(n)]


def test_the_ring_holds_the_newest_samples_in_order():
    track = GpuTrack(Gpu(0, "SIM-x", "sim", "simulated"), ring_size=8)
    track.add(samples(0, 5))
    track.add(samples(5 * PERIOD, 7))
    held = list(track.ring)
    assert len(track.ring) == 8 and [t for t, _, _ in held] == [(k + 1) * PERIOD for k in range(4, 12)]
    assert held[0] == (5 * PERIOD, PERIOD, 0.4) and isinstance(held[0][0], int)
    assert [s[0] for s in track.window(0.25, now_ns=12 * PERIOD)] == [10 * PERIOD, 11 * PERIOD, 12 * PERIOD]
    assert track.busy_seconds > 0 and track.sampled_seconds == 12 * PERIOD / 1e9


def _held_by_source(snapshot):
    """Bytes still held that source.py's lines or this file's (the samples handed in)
    allocated: other threads of the test process (an earlier test's daemon sampler)
    allocate meanwhile, and tracemalloc's total counts them too (a CI run: 19,723 bytes)."""
    mine = [tracemalloc.Filter(True, source.__file__), tracemalloc.Filter(True, __file__)]
    return sum(stat.size for stat in snapshot.filter_traces(mine).statistics("filename"))


def test_reading_a_gpu_for_hours_allocates_nothing_after_its_first_samples():
    tracemalloc.start()
    try:
        track = GpuTrack(Gpu(0, "SIM-x", "sim", "simulated"))
        track.add(samples(0, 10))
        before = _held_by_source(tracemalloc.take_snapshot())
        t = 10 * PERIOD
        for _ in range(3 * RING_SIZE // 5):  # 3 rings' worth, 5 samples a read (the simulation's pace)
            track.add(samples(t, 5))
            t += 5 * PERIOD
        grown = _held_by_source(tracemalloc.take_snapshot()) - before
    finally:
        tracemalloc.stop()
    assert len(track.ring) == RING_SIZE
    # a deque of tuples held ~130 bytes a sample: 500 KiB here
    assert grown < 16 * 1024, grown
    assert track.ring.times.nbytes + track.ring.ratios.nbytes == RING_SIZE * SAMPLE_BYTES


def test_the_budget_counts_the_ring_the_sampler_keeps():
    assert (GPU_RING, GPU_SAMPLE_BYTES) == (RING_SIZE, SAMPLE_BYTES)
