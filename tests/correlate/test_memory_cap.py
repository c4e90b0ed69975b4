"""Worker counts capped by memory (issue 30, item 3), on a real run: one DataLoader worker
whose samples each wait 50 ms off the CPU (a fetch) against 10 ms of compute, so ~20
workers would keep up on the means; each worker holds 256 MiB of its own, and the rank
runs in a memory cgroup whose limit holds only a few more. The agent's prediction is
the count the limit holds, from the kernel's own numbers (memory.max, memory.current,
the worker's RSS in /proc/<pid>/stat), and says what else hides an off-CPU wait."""
import json
import os
import subprocess
import sys
import time

import pytest

from stallscope.exporters import worker_deaths
from tests.helpers import wait_until
from tests.helpers.exporters import kill, scratch_cgroup, write
from tests.helpers.needs import need_memory_cgroup

pytestmark = pytest.mark.slow
MiB = 1 << 20
LIMIT = 1536 * MiB

TRAINER = """
import sys, time, torch, stallscope
from torch.utils.data import DataLoader, Dataset

HELD = []

def hold(_worker_id):
    HELD.append(bytearray(256 << 20))  # touched: resident, the worker's own
    for i in range(0, len(HELD[0]), 4096):
        HELD[0][i] = 1

class Fetched(Dataset):
    def __len__(self):
        return 1 << 20
    def __getitem__(self, i):
        time.sleep(0.05)  # off the CPU, as a network fetch
        return torch.zeros(4)

loader = stallscope.watch(DataLoader(Fetched(), batch_size=4, num_workers=1, worker_init_fn=hold,
                                     persistent_workers=True), job="mem", rank=0)
t0 = time.monotonic()
for _ in loader:
    time.sleep(0.01)
    if time.monotonic() - t0 > float(sys.argv[1]):
        break
print("done", flush=True)
sys.stdin.read()
"""


def rss_bytes(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def test_the_worker_count_predicted_is_what_the_memory_limit_holds(agent_factory, hook_env, tmp_path):
    base, version = need_memory_cgroup()
    pytest.importorskip("torch")
    agent = agent_factory("--exporter.interval", "1", "--correlate.interval", "2",
                          "--correlate.window", "30")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    with scratch_cgroup(base) as (cg, procs):
        write(os.path.join(cg, "memory.limit_in_bytes" if version == "v1" else "memory.max"), str(LIMIT))
        trainer = subprocess.Popen(
            ["sh", "-c", "echo $$ > %s/cgroup.procs && exec %s %s 14" % (cg, sys.executable, script)],
            env=hook_env(agent), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(trainer)
        try:
            assert trainer.stdout.readline().strip() == "done"
            [rank] = wait_until(lambda: [r for r in agent.api("/api/v1/ranks")["ranks"] if r["job"] == "mem"])
            [worker] = rank["worker_pids"]
            # the kernel's numbers now and over the next collections: the cap they give
            caps = []
            for _ in range(3):
                used, rss = worker_deaths.memory_used(cg, version), rss_bytes(worker)
                caps.append(1 + (LIMIT - used) // rss)
                time.sleep(1.0)
            d = agent.api("/api/v1/diagnosis?pod=%s&seconds=12" % rank["pod"])
        finally:
            trainer.stdin.close()
            kill(trainer)
    assert rss_bytes_ok(caps), caps
    assert d["verdict"] == "input_bound", json.dumps(d)[:2000]
    p = d.get("prediction") or {}
    assert p.get("cause") == "too_few_workers", json.dumps(d)[:3000]
    # ~20 workers keep up on the means (0.2 s a batch against 10 ms); the limit holds a few
    assert (p["settings"] or {}).get("num_workers") in range(min(caps), max(caps) + 1), (p, caps)
    assert p["change"].endswith("(the most the pod's memory limit holds)"), p
    note = p["memory_note"]
    assert "%d MiB" % (LIMIT // MiB) in note and "threads or async I/O" in note, note
    needed = int(note.split(" workers would keep up")[0])
    assert needed >= 10, note
    print("kernel: the limit holds %s workers; predicted: %s; %s" % (caps, p["change"], note))


def rss_bytes_ok(caps):
    """The limit holds more than the one worker and far fewer than the run needs."""
    return all(2 <= c <= 5 for c in caps)
