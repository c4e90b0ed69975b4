"""GPU <-> rank map: table tests over real RankState objects, and the hook's CUDA device
report with the real (CPU) torch, which must never initialise CUDA."""
import subprocess
import sys

import pytest

from stallscope.agent.table.rankstate import RankState
from stallscope.exporters.gpu.mapping import build, uuid_key
from stallscope.exporters.gpu.source import Gpu
from stallscope.hook import device
from tests.helpers.gpu import U0, U1


def rank(r, pid, pod="w-0", cuda=None):
    ident = {"job": "j", "rank": r, "local_rank": r, "world_size": 8, "pod": pod,
             "namespace": "ml", "node": "n"}
    s = RankState(("ml", pod, "j", r), ident, 0.0, 10)
    s.pid = pid
    s.cuda = {"index": 0, "uuid": cuda} if cuda else None  # the hook's report, as the gpu exporter keeps it
    return s


def mapped(ranks, found_gpus, pods=None):
    return build(ranks, found_gpus, pods, {r.key: r.cuda for r in ranks if r.cuda})


def gpus(pids0=None, pids1=None):
    return [(Gpu(0, U0, "H100", "nvml"), pids0 or {}), (Gpu(1, U1, "H100", "nvml"), pids1 or {})]


def test_uuid_spellings():
    assert uuid_key(U0) == uuid_key(U0[4:]) == uuid_key(U0.lower()) == uuid_key(" " + U0)
    assert uuid_key("MIG-1234") == "1234" and uuid_key(None) == ""


def test_cuda_device_report_wins_over_nvml_processes():
    # Rank 0 reports cuda:0 (torch spells the UUID without "GPU-") but NVML also lists
    # its PID on GPU 1 with more memory: the report is what the loop computes on.
    r0 = rank(0, 100, cuda=U0[4:])
    m = mapped([r0], gpus(pids1={100: 40 << 30}))
    assert m.gpu_of[r0.key] == (U0, "cuda_device")


def test_nvml_processes_pick_the_gpu_with_the_most_memory():
    # The stray context: every rank holds ~500 MiB on GPU 0 from a default-device init.
    r0, r1 = rank(0, 100), rank(1, 101)
    m = mapped([r0, r1], gpus(pids0={100: 60 << 30, 101: 500 << 20}, pids1={101: 60 << 30}))
    assert m.gpu_of == {r0.key: (U0, "nvml_process"), r1.key: (U1, "nvml_process")}
    assert m.ranks_of[U0] == [r0.key] and m.ranks_of[U1] == [r1.key]


def test_dcgm_pod_only_when_unambiguous():
    lone, a, b = rank(0, 1, pod="solo"), rank(1, 2, pod="pair"), rank(2, 3, pod="pair")
    pods = {U0: ("ml", "solo"), U1: ("ml", "pair")}
    m = mapped([lone, a, b], [], pods)
    assert m.gpu_of == {lone.key: (U0, "dcgm_pod")}


def test_an_unknown_uuid_and_no_evidence_leave_a_rank_unmapped():
    r0 = rank(0, 100, cuda="GPU-00000000-0000-0000-0000-000000000000")
    assert mapped([r0], gpus()).gpu_of == {}


def test_several_ranks_may_share_a_gpu():
    r0, r1 = rank(0, 100, cuda=U1), rank(1, 101, cuda=U1)
    m = mapped([r0, r1], gpus())
    assert m.ranks_of[U1] == [r0.key, r1.key] and m.via(r1.key) == "cuda_device"


def test_hook_reports_nothing_and_never_initialises_cuda_with_cpu_torch():
    code = ("import torch, stallscope.hook.device as d\n"
            "print(d.cuda_device(), torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["None", "False"], out.stderr


def test_hook_reports_the_current_device_when_cuda_is_initialised(monkeypatch):
    torch = pytest.importorskip("torch")

    class Props:
        uuid = U1[4:]  # torch prints the bare UUID

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    assert device.cuda_device() == {"index": 1, "uuid": U1}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1 / 0)
    assert device.cuda_device() is None  # never raises into the loop
