"""Why a loader worker died, against the real kernel outcome: a real DataLoader whose
worker is really killed by SIGBUS on a full tmpfs /dev/shm (a private mount namespace),
and one really OOM-killed in a memory cgroup with a limit. The trainer prints what the
kernel said (multiprocessing's exit code of each worker); the cgroup's own oom_kill
counter is read by the test. The agent must agree with both."""
import json
import os
import subprocess
import sys

import pytest

from stallscope.exporters import worker_deaths
from tests.helpers import wait_until
from tests.helpers.exporters import kill, scraped, scratch_cgroup, write
from tests.helpers.needs import need_memory_cgroup, need_root

# Workers fill a per-sample block from sample START on; until then they are slow enough
# for the agent to know the rank and its workers (their first reports).
TRAINER = """
import json, os, sys, time, torch, stallscope
from multiprocessing import shared_memory
from torch.utils.data import DataLoader, Dataset

KIND, START = sys.argv[1], 16
held = []
if KIND == "shm":  # something else holds most of /dev/shm (another process, in a real pod)
    with open("/dev/shm/other", "wb") as f:
        f.write(b"\1" * (19 << 20))

class Filling(Dataset):
    def __len__(self):
        return 10 ** 6
    def __getitem__(self, i):
        time.sleep(0.1)
        if i >= START and KIND == "shm":
            # a mapping that is not fallocate'd (torch's own buffers are): a page that
            # tmpfs cannot back is a SIGBUS when touched
            m = shared_memory.SharedMemory(create=True, size=8 << 20)
            m.buf[:] = b"\\1" * (8 << 20)
            held.append(m)
        elif i >= START and KIND == "oom":
            held.append(bytearray(b"\\1" * (24 << 20)))  # ~240 MiB/s of growth per worker
        return torch.zeros(4)

loader = stallscope.watch(DataLoader(Filling(), batch_size=1, num_workers=2), job="wd", rank=0, pod="p0")
it = iter(loader)
try:
    for _ in it:
        pass
except RuntimeError as e:
    print(json.dumps({"error": str(e).splitlines()[0],
                      "exitcodes": {str(w.pid): w.exitcode for w in it._workers}}), flush=True)
time.sleep(60)
"""


def run_until_a_worker_dies(cmd, env):
    trainer = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = trainer.stdout.readline()
        assert line, "the trainer ended without a worker death"
        return trainer, json.loads(line)
    except BaseException:
        kill(trainer)
        raise


def deaths_of(agent):
    ranks = agent.api("/api/v1/ranks?job=wd")["ranks"]

    return ranks[0].get("worker_deaths", []) if ranks else []


@pytest.mark.slow
def test_a_worker_killed_by_a_full_dev_shm_is_a_sigbus_of_shm_exhaustion(agent_factory, hook_env, tmp_path):
    need_root()
    pytest.importorskip("torch")
    agent = agent_factory("--exporter.interval", "0.5")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    # 20 MiB of /dev/shm, 19 MiB of it held: a worker's 8 MiB block cannot be backed
    cmd = ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=20m tmpfs /dev/shm && exec %s %s shm"
           % (sys.executable, script)]
    trainer, out = run_until_a_worker_dies(cmd, hook_env(agent))
    try:
        # the kernel's word: the worker ended by signal 7 (multiprocessing's -7)
        bused = {int(p) for p, code in out["exitcodes"].items() if code == -7}
        assert bused, out
        deaths = wait_until(lambda: [d for d in deaths_of(agent) if d["pid"] in bused], timeout=10)
        for d in deaths:
            assert d["signal"] == "SIGBUS" and d["reason"] == "shm_exhaustion", d
            assert d["shm_used_ratio"] >= worker_deaths.SHM_FULL
            assert "/dev/shm" in d["summary"]
        # the exporters' families are from their last collection: wait for the next
        wait_until(lambda: scraped(agent.metrics(), "stallscope_loader_worker_exits_total", job="wd",
                                   pod="p0", reason="shm_exhaustion")
                   == [len(deaths_of(agent))], timeout=10)
    finally:
        kill(trainer)


def oom_signal_total(agent):
    body = agent.api("/api/v1/timeline?rank=0&job=wd&seconds=120")
    return sum(v for _t, v in body.get("signals", {}).get("workers_oom_killed", []))


@pytest.mark.slow
def test_a_worker_oom_killed_under_a_memory_limit_is_memory_limit_with_its_growth(
        agent_factory, hook_env, tmp_path):
    base, version = need_memory_cgroup()
    pytest.importorskip("torch")
    agent = agent_factory("--exporter.interval", "0.5")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    limit = 900 << 20
    with scratch_cgroup(base) as (cg, _procs):
        write(os.path.join(cg, "memory.limit_in_bytes" if version == "v1" else "memory.max"), str(limit))
        events = os.path.join(cg, "memory.oom_control" if version == "v1" else "memory.events")
        cmd = ["sh", "-c", "echo $$ > %s/cgroup.procs && exec %s %s oom" % (cg, sys.executable, script)]
        trainer, out = run_until_a_worker_dies(cmd, hook_env(agent))
        try:
            killed = {int(p) for p, code in out["exitcodes"].items() if code == -9}
            assert killed, out
            oom_kills = worker_deaths.oom_kills(cg, version)
            assert oom_kills >= 1, open(events).read()  # the kernel's own count
            deaths = wait_until(lambda: [d for d in deaths_of(agent) if d["pid"] in killed], timeout=10)
            assert len(deaths) <= oom_kills
            for d in deaths:
                assert d["signal"] == "SIGKILL" and d["reason"] == "memory_limit", d
                assert d["memory_limit_bytes"] == limit
                assert os.path.realpath(d["memory_cgroup"]) == os.path.realpath(cg)
                # it grew ~240 MiB/s per worker before the kill (loose: a loaded machine)
                assert d["last_rss_bytes"] > 100 << 20
                if d["rss_growth_bytes_per_second"] is not None:
                    assert d["rss_growth_bytes_per_second"] > 20 << 20
            wait_until(lambda: scraped(agent.metrics(), "stallscope_loader_worker_exits_total",
                                       job="wd", reason="memory_limit")
                       == [len(deaths_of(agent))], timeout=10)
            # the correlator's signal for the memory_limit cause counts the same kills
            wait_until(lambda: oom_signal_total(agent) == len(deaths_of(agent)), timeout=10)
        finally:
            kill(trainer)
