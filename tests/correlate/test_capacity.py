"""One capacity model for every prediction (correlate/capacity.py, issue 49 item 2): a
worker-count change is replayed under every capacity it touches and says which binds;
no "high" confidence across a capacity that was not measured. Expected values are
derived here from what is injected."""
import numpy as np
import pytest

from stallscope.correlate import capacity, predict
from stallscope.correlate.predict import Measured, replay
from stallscope.hook.watch import _dataset_shards
from tests.agent.test_validate import good
from tests.helpers.correlate import wire


def _cpu_bound(workers=1, cpus=None, cores_used=None, n=200, **kw):
    """Workers busy on the CPU: each batch takes 0.32 CPU-s (8 samples x 40 ms) against
    0.1 s of compute, so one worker delivers a batch every 0.32 s."""
    load, compute = np.full(n, 0.32), np.full(n, 0.1)
    step = max(compute.mean(), load.mean() / workers)
    return Measured(step_seconds=step, compute=compute, load=load, workers=workers, prefetch=2,
                    data_wait_ratio=1 - compute.mean() / step,
                    workers_cpu_cores=workers * 1.0 if cores_used is None else cores_used,
                    cpus=cpus, **kw)


def test_without_the_cores_measured_a_cpu_hungry_prediction_is_not_high():
    """Issue 49: "1 -> 3 workers, wait 0.0 %" on 2 cores, measured 13 %: the model asked
    the node for two more cores nobody measured."""
    m = _cpu_bound()
    p = wire(predict.workers(m))
    assert p["settings"] == {"num_workers": 4}  # ceil(0.32 / 0.1): the queue alone
    assert p["confidence"] == "medium"
    assert "assumes 3 more cores free on the node" in p["basis"], p["basis"]


def test_on_two_cores_the_cores_bind_and_the_prediction_says_so():
    # 2 CPUs, a core kept for the training process: the workers get 1 core, so 0.32 CPU-s a
    # batch come at most every 0.32 s, however many workers share it: no count keeps up
    m = _cpu_bound(cpus=2)
    caps = capacity.of(m)
    cores = next(c for c in caps if c.name == "cores")
    assert cores.measured and cores.limit == pytest.approx(1.0)
    assert cores.floor == pytest.approx(m.cpu_per_batch / 1.0)
    assert predict.workers(m) is None
    why = predict.why_not_more_workers(m)
    assert why is not None and "share the same cores" in why and "cores the workers may run on" in why
    p = wire(predict.for_cause("too_few_workers", m))
    assert p["settings"] == {} and p["rules_out"] == ["num_workers"]


def test_on_eight_cores_the_workers_get_what_they_need_with_high_confidence():
    m = _cpu_bound(cpus=8)
    p = wire(predict.workers(m))
    assert p["settings"] == {"num_workers": 4}
    assert p["confidence"] == "high" and "assumes" not in p["basis"]
    assert p["predicted_data_wait_ratio"] <= predict.TARGET


def test_partly_bound_by_the_cores_predicts_the_wait_left_and_names_it():
    # 4 CPUs: 3 for the workers, a batch every 0.32 / 3 s at best against 0.1 s of compute:
    # close enough to keep the target with 4 workers? No: 0.107 > 0.1, the wait stays
    m = _cpu_bound(cpus=4)
    floor = m.cpu_per_batch / 3
    assert floor > m.compute_mean
    assert predict.workers(m) is None  # floor above compute x (1 - TARGET): nothing keeps up
    m = _cpu_bound(cpus=5)  # 4 cores: 0.08 s a batch at best, under the compute
    p = wire(predict.workers(m))
    wait, _ = replay(m.load, m.compute, p["settings"]["num_workers"], 2, m.cpu_per_batch / 4)
    assert p["predicted_data_wait_ratio"] == pytest.approx(wait, abs=1e-3)


def test_the_dataset_shards_cap_the_workers():
    """Issue 49: an HF streaming dataset of 2 files, "2 -> 4 workers, wait 0.0 %"; datasets
    stops the 2 extra workers and the wait stays."""
    off_cpu = dict(cores_used=0.05, cpus=8)
    m = _cpu_bound(workers=2, dataset_shards=2, **off_cpu)
    assert predict.workers(m) is None
    why = predict.why_not_more_workers(m)
    assert "2 shards" in why and "no data" in why
    m = _cpu_bound(workers=2, dataset_shards=3, **off_cpu)
    p = wire(predict.workers(m))
    assert p["settings"] == {"num_workers": 3} and "one a shard" in p["change"]
    wait, _ = replay(m.load, m.compute, 3, 2)
    assert p["predicted_data_wait_ratio"] == pytest.approx(wait, abs=1e-3) and wait > predict.TARGET
    assert p["bound_by"] == "shards"


def test_a_measured_read_limit_binds_and_an_unmeasured_device_is_assumed():
    """Issue 49: reads capped by a bytes-a-second limit on the device; the queue replay
    assumed load times independent of how many workers share it."""
    # 8 MB a batch; the cgroup may read 20 MB/s: a batch every 0.4 s at best
    off_cpu = dict(cores_used=0.05, cpus=8)
    rate = 8e6 / 0.32  # one worker's reads now: 8 MB every 0.32 s
    m = _cpu_bound(io_read_limit=20e6, block_read_bytes_per_second=rate, **off_cpu)
    dev = next(c for c in capacity.of(m) if c.name == "device")
    assert dev.floor == pytest.approx(8e6 / 20e6, rel=0.01)
    assert predict.workers(m) is None
    assert "share the same read limit" in predict.why_not_more_workers(m)
    m = _cpu_bound(block_read_bytes_per_second=rate, **off_cpu)
    p = wire(predict.workers(m))
    assert p["confidence"] == "medium"
    assert "assumes the device to deliver" in p["basis"]
    # the speed it assumes: today's rate times the predicted speedup
    assert "%.3g MB/s" % (rate * p["speedup"] / 1e6) in p["basis"]


def test_the_hook_reads_an_iterable_datasets_shards_and_the_agent_bounds_them():
    import torch.utils.data as data

    class Stream(data.IterableDataset):
        def __iter__(self):
            return iter(())

    class Sharded(Stream):  # as Hugging Face's: a torch IterableDataset
        n_shards = 2

    class Newer(Stream):
        num_shards = 3

    class Raising(Stream):
        @property
        def num_shards(self):
            raise RuntimeError("not ours to break")

    class NotIterable:  # a map-style dataset's own "shards" say nothing of its workers
        num_shards = 4

    assert _dataset_shards(Sharded()) == 2 and _dataset_shards(Newer()) == 3
    assert _dataset_shards(Raising()) is None
    assert _dataset_shards(NotIterable()) is None and _dataset_shards(object()) is None
    from stallscope.agent.table import validate
    loader = {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False,
              "batch_size": 4, "worker_pids": [11, 12]}
    assert validate.parse(good(loader=dict(loader, dataset_shards=2))).loader.dataset_shards == 2
    for bad in (0, -1, "2", 1 << 30):
        with pytest.raises(validate.Reject):
            validate.parse(good(loader=dict(loader, dataset_shards=bad)))
