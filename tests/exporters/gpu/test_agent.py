"""The GPU part inside a real agent: fake NVML (two GPUs), a real dcgm-exporter-format
endpoint over HTTP, real hook channels reporting two ranks; /metrics, /api/v1/ranks and
/api/v1/timeline carry the GPU series with the rank they serve."""
import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.exporters import ExportersOptions
from stallscope.exporters.gpu.options import GpuOptions
from stallscope.hook import channel, identity
from tests.helpers.gpu import U0, U1, DcgmServer, fixture

pynvml = pytest.importorskip("pynvml")  # the fake is built from the real module's classes
from tests.helpers.fake_nvml import FakeGpu, FakeNvml, constant  # noqa: E402


def get(agent, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (agent.port, path), timeout=5) as r:
        return r.read().decode()


def series(text):
    return [(s.name, s.labels, s.value)
            for f in text_string_to_metric_families(text) for s in f.samples]


def wait_for(fn, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


OTHERS = {n: False for n in ("cfs", "psi", "shm", "fuse", "workers", "disk", "sched")}


def make_agent(tmp_path, **gpu):
    """An in-process agent running only the gpu exporter, collecting every 0.2 s."""
    cfg = Config(agent=AgentOptions(listen="127.0.0.1:0", socket=str(tmp_path / "hook.sock"),
                                    node="gpu-node-7"),
                 exporters=ExportersOptions(interval=0.2), enabled=OTHERS,
                 parts={GpuOptions: GpuOptions(**gpu)})
    return Agent(cfg)


@pytest.fixture
def running(tmp_path):
    me = os.getpid()
    fake = FakeNvml([
        # GPU 0: the process's real work (60 GiB); GPU 1: a stray context (500 MiB).
        FakeGpu(0, uuid=U0, busy=constant(0.75), processes=[(me, 60 << 30)]),
        FakeGpu(1, uuid=U1, busy=constant(0.25), processes=[(me, 500 << 20)]),
    ])
    dcgm = DcgmServer(fixture("dcgm-exporter-k8s.txt"))
    agent = make_agent(tmp_path, nvml_module=fake, sample_interval=0.1,
                       dcgm_url=dcgm.url, dcgm_interval=0.2)
    agent.start()
    stopped = []

    def stop():  # Agent.stop() is not idempotent
        if not stopped:
            stopped.append(agent.stop())

    try:
        yield agent, fake, stop, dcgm
    finally:
        stop()
        dcgm.close()


def report(path, rank, cuda):
    ch = channel.Channel(path)
    ident = identity.detect(env={}, job="llm", rank=rank, pod="llm-pretrain-worker-0",
                            namespace="ml-team", node="gpu-node-7")
    s = channel.Stream(ident)
    s.cuda = cuda
    t = time.perf_counter_ns()
    s.buf.extend([t - 2_000_000, t - 1_000_000])
    ch.streams.append(s)
    ch.flush()
    return ch


def test_gpu_series_carry_their_rank_and_source(running):
    agent, fake, _, dcgm = running
    # Rank 3 reports cuda:1 the way torch spells it; rank 5 reports nothing and is found
    # through NVML's compute processes; rank 7's report is garbage.
    report(agent.config.agent.socket, 3, {"index": 1, "uuid": U1[4:]})
    report(agent.config.agent.socket, 5, None)
    report(agent.config.agent.socket, 7, {"index": "one", "uuid": U1})

    def mapped():
        ranks = {r["rank"]: r.get("gpu") for r in json.loads(get(agent, "/api/v1/ranks"))["ranks"]}
        # all three: the reports arrive on three connections, in no fixed order. A
        # collection may see rank 3 in the table before its report's CUDA device is
        # handled and map it by NVML's process list first (refresh() drops those samples
        # when the better evidence arrives): wait for that evidence to be used.
        done = ranks.get(3) and ranks.get(5) and ranks.get(7) and ranks[3].get("via") == "cuda_device"
        return ranks if done else None

    ranks = wait_for(mapped)
    assert ranks, "rank 3 never mapped by its CUDA device report"
    assert ranks[3] == {"uuid": U1, "gpu": "1", "source": "nvml", "via": "cuda_device"}
    assert ranks[5] == {"uuid": U0, "gpu": "0", "source": "nvml", "via": "nvml_process"}
    assert ranks[7]["via"] == "nvml_process"  # its report rejected, its PID still found
    # dcgm-exporter collects again (its -c interval): recorded under the mapped ranks too.
    dcgm.body = dcgm.body.replace("0.443105", "0.443107")

    def timeline():
        body = json.loads(get(agent, "/api/v1/timeline?rank=3&seconds=60"))
        sm = body["signals"].get("gpu_sm_active_ratio")
        new_collection = sm and sm[-1][1] == pytest.approx(0.443107)
        return body if body["signals"].get("gpu_busy_ratio") and new_collection else None

    body = wait_for(timeline)
    assert body, "rank 3's GPU samples never reached its timeline"
    assert body["gpu"]["via"] == "cuda_device" and body["gpu"]["busy"]
    busy = body["signals"]["gpu_busy_ratio"]
    assert all(v == pytest.approx(0.25, abs=0.006) for _, v in busy), busy
    assert agent.samples.series(("gpu", U0), "gpu_busy_ratio")

    got = series(get(agent, "/metrics"))
    mine = [(n, labels, v) for n, labels, v in got
            if n.startswith("stallscope_gpu_") and labels.get("rank") == "3"]
    names = sorted(n for n, _, _ in mine)
    assert names == ["stallscope_gpu_busy_ratio", "stallscope_gpu_busy_seconds_total",
                     "stallscope_gpu_sm_active_ratio"]  # 3 series against the per-rank budget
    for _n, labels, _v in mine:
        assert labels["uuid"] == U1 and labels["gpu"] == "1" and labels["job"] == "llm"
        assert labels["pod"] == "llm-pretrain-worker-0" and labels["node"] == "gpu-node-7"
    busy = {labels["rank"]: v for n, labels, v in got if n == "stallscope_gpu_busy_ratio"}
    assert busy["3"] == pytest.approx(0.25, abs=0.006) and busy["5"] == pytest.approx(0.75, abs=0.006)
    sm = {(labels["gpu"], labels["rank"]): (labels["field"], v)
          for n, labels, v in got if n == "stallscope_gpu_sm_active_ratio"}
    assert sm[("0", "5")] == ("DCGM_FI_PROF_SM_ACTIVE", 0.812345)
    assert sm[("2", "")] == ("DCGM_FI_DEV_GPU_UTIL", 0.37)  # dcgm-only GPU, no rank
    up = {labels["uuid"]: v for n, labels, v in got if n == "stallscope_gpu_up"}
    assert up == {U0: 1.0, U1: 1.0}
    errors = {(labels["source"], labels["reason"]): v
              for n, labels, v in got if n == "stallscope_gpu_read_errors_total"}
    assert errors == {("hook", "bad_cuda"): 1.0}

    (status,) = [e for e in json.loads(get(agent, "/api/v1/exporters"))["exporters"]
                 if e["exporter"] == "gpu"]
    assert status["available"] and status["success"]

    fake.gpus[1].lost = True
    lost = wait_for(lambda: [v for n, labels, v in series(get(agent, "/metrics"))
                             if n == "stallscope_gpu_up" and labels["uuid"] == U1 and v == 0])
    assert lost
    assert not [labels for n, labels, v in series(get(agent, "/metrics"))
                if n == "stallscope_gpu_busy_ratio" and labels["uuid"] == U1]


def test_a_rank_mapped_to_another_gpu_keeps_only_its_own_gpus_samples(running):
    """A rank is first seen without its CUDA device (a report without one, or a collection
    between the rank's registration and its report's handling): NVML's process list maps
    it to the GPU where its process holds the most memory, GPU 0 at 75 % busy. When the
    hook's device report maps it to GPU 1 (25 % busy), GPU 0's samples leave its series."""
    agent, _fake, _, _ = running
    report(agent.config.agent.socket, 3, None)

    def busy(via):
        try:
            body = json.loads(get(agent, "/api/v1/timeline?rank=3&seconds=60"))
        except urllib.error.HTTPError as e:  # 404 until the report is read
            assert e.code == 404, e
            return None
        got = body["signals"].get("gpu_busy_ratio")
        return got if body.get("gpu", {}).get("via") == via and got else None

    guessed = wait_for(lambda: busy("nvml_process"))
    assert guessed and all(v == pytest.approx(0.75, abs=0.006) for _, v in guessed), guessed
    report(agent.config.agent.socket, 3, {"index": 1, "uuid": U1[4:]})
    mapped = wait_for(lambda: busy("cuda_device"))
    assert mapped and all(v == pytest.approx(0.25, abs=0.006) for _, v in mapped), mapped
    assert agent.samples.series(("gpu", U0), "gpu_busy_ratio")  # GPU 0's own series stays


def test_sampler_threads_stop_with_the_agent(running):
    agent, fake, stop, _ = running

    def part_threads():
        found = [t for t in threading.enumerate() if t.name.startswith("stallscope-gpu-")]
        return found if len(found) == 2 else None

    threads = wait_for(part_threads)
    assert {t.name for t in threads} == {"stallscope-gpu-nvml", "stallscope-gpu-dcgm"}
    stop()
    for t in threads:
        t.join(5)
        assert not t.is_alive()
    assert fake.initialised == 0  # nvmlShutdown on the way out


def test_a_node_without_gpus_reports_not_available_once(tmp_path, capfd):
    fake = FakeNvml([FakeGpu(0)], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    agent = make_agent(tmp_path, nvml_module=fake)
    agent.start()
    try:
        def status():
            (st,) = [e for e in json.loads(get(agent, "/api/v1/exporters"))["exporters"]
                     if e["exporter"] == "gpu"]
            return st if st["available"] is False else None

        st = wait_for(status)
        assert "nvml: no NVIDIA driver on this node" in st["unavailable_reason"]
        assert st["success"]  # not asked for explicitly: not an error
        time.sleep(0.5)  # a few more collections
        got = series(get(agent, "/metrics"))
        assert [v for n, labels, v in got
                if n == "stallscope_exporter_available" and labels["exporter"] == "gpu"] == [0]
        assert not [n for n, _, _ in got if n.startswith("stallscope_gpu_")]
    finally:
        agent.stop()
    err = capfd.readouterr().err
    assert err.count("exporter gpu: not available on this node") == 1, err
