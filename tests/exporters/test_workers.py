"""workers exporter: real processes as loader workers (busy, frozen on a hung FUSE mount
into D state, killed by SIGBUS and left a zombie, replaced by a new generation), and a
real DataLoader's workers found through the hook and reported by a real agent."""
import os
import signal
import subprocess
import sys

import pytest

from stallscope.exporters import workers
from tests.helpers import wait_until
from tests.helpers.exporters import (
    collect,
    context,
    kill,
    rank_message,
    samples_of,
    scraped,
    spawn,
    table_with,
    values,
)

BUSY_THEN_SLEEP = ("import time\n"
                   "t = time.process_time() + {secs}\n"
                   "while time.process_time() < t: pass\n"
                   "print('done', flush=True)\n"
                   "time.sleep(60)\n")


@pytest.fixture
def procs():
    made = []
    yield made
    for p in made:
        kill(p)


def busy(procs, secs):
    p = spawn(BUSY_THEN_SLEEP.format(secs=secs), stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout.readline().strip() == "done"
    return p


def test_cpu_accumulates_across_worker_generations_and_series_stay_few(procs):
    main = subprocess.Popen(["sleep", "60"])
    procs.append(main)
    gen1 = [busy(procs, 0.2), busy(procs, 0.2)]
    table = table_with(dict(pid=main.pid, worker_pids=[p.pid for p in gen1]))
    rank = table.snapshot()[0]
    ctx = context(table)
    exp = workers.WorkersExporter(ctx)
    fams = collect(exp, [rank])
    # 4 series per rank: alive, D state, CPU, largest RSS (per-worker ones are opt-in)
    assert len([k for k in samples_of(fams) if ("rank", "0") in k[1]]) == 4
    assert values(fams, "stallscope_loader_workers_alive", rank="0") == [2]
    [cpu1] = values(fams, "stallscope_loader_workers_cpu_seconds_total")
    assert cpu1 >= 0.4
    [rss] = values(fams, "stallscope_loader_worker_max_resident_memory_bytes")
    # the kernel's RSS counters are per-CPU and summed when read: two reads of a sleeping
    # process may differ by a few pages
    assert rss == pytest.approx(max(__import__("psutil").Process(p.pid).memory_info().rss
                                    for p in gen1), rel=0.02)
    for p in gen1:  # the epoch ends: the workers exit, a new generation starts
        kill(p)
    gen2 = [busy(procs, 0.3)]
    with table.lock:
        rank.worker_pids = [p.pid for p in gen2]
    fams = collect(exp, [rank])
    [cpu2] = values(fams, "stallscope_loader_workers_cpu_seconds_total")
    assert cpu2 >= cpu1 + 0.3
    assert values(fams, "stallscope_loader_workers_alive") == [1]
    [(_, ratio)] = ctx.samples.series(rank.key, "workers_cpu_ratio")
    assert ratio > 0
    assert [w["worker"] for w in exp.rows[rank.key]] == [0]


ZOMBIE = ("import os, signal, time\n"
          "pid = os.fork()\n"
          "if pid == 0:\n"
          "    os.kill(os.getpid(), signal.SIGBUS)\n"
          "print(pid, flush=True)\n"
          "time.sleep(60)  # never reaps the child: it stays a zombie\n")


def test_an_exit_by_signal_is_counted_while_the_worker_is_a_zombie(procs):
    parent = spawn(ZOMBIE, stdout=subprocess.PIPE, text=True)
    procs.append(parent)
    child = int(parent.stdout.readline())
    wait_until(lambda: open("/proc/%d/stat" % child).read().split(") ")[1][0] == "Z")
    table = table_with(dict(pid=parent.pid, worker_pids=[child]))
    rank = table.snapshot()[0]
    ctx = context(table)
    exp = workers.WorkersExporter(ctx)
    for _ in range(2):  # counted once, however often it is seen
        fams = collect(exp, [rank])
    # no /dev/shm of its own filled up: a SIGBUS without that evidence is "other"
    assert values(fams, "stallscope_loader_worker_exits_total", reason="other") == [1]
    assert values(fams, "stallscope_loader_worker_exits_total", reason="shm_exhaustion") == [0]
    assert exp.rank_fields(rank)["worker_deaths"][0]["signal"] == "SIGBUS"
    assert values(fams, "stallscope_loader_workers_alive") == [0]
    assert exp.rows[rank.key][0]["state"] == "zombie"
    assert exp.rows[rank.key][0]["exit_signal"] == "SIGBUS"


def test_a_reported_death_counts_though_the_next_loaders_report_came_first(procs):
    """The trainer's waitpid saw a worker die (the old iterator's last report carries its
    exit code); the restarted loader's first report comes before the exporter collects.
    CI once counted 3 of 4 such deaths: the exit lived only in rank.loader, which the
    new loader's report replaced."""
    main = subprocess.Popen(["sleep", "60"])
    procs.append(main)
    old = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    new = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    procs.extend(old + new)
    for p in old:
        kill(p)
    table = table_with(dict(pid=main.pid, worker_pids=[p.pid for p in old]))
    report = rank_message(main.pid, [p.pid for p in old], worker_exits=[[old[0].pid, -signal.SIGBUS]])
    for _ in range(2):  # a stream repeats its exits until it ends
        table.apply(report)
    table.apply(rank_message(main.pid, [p.pid for p in new]))
    [rank] = table.snapshot()
    exp = workers.WorkersExporter(context(table))
    for _ in range(2):
        fams = collect(exp, [rank])
    assert values(fams, "stallscope_loader_worker_exits_total", reason="other") == [1]
    assert [d["pid"] for d in exp.rank_fields(rank)["worker_deaths"]] == [old[0].pid]
    # a code for a PID the report does not name as its worker is not counted
    stranger = rank_message(main.pid, [p.pid for p in new], worker_exits=[[main.pid, -signal.SIGKILL]])
    table.apply(stranger)
    fams = collect(exp, [rank])
    assert values(fams, "stallscope_loader_worker_exits_total", reason="other") == [1]
    assert values(fams, "stallscope_loader_worker_exits_total", reason="memory_limit") == [0]


def test_a_worker_blocked_on_a_hung_mount_counts_in_d_state(procs, tmp_path):
    from stallscope.lab import slowfs
    from tests.helpers.needs import need_fuse

    need_fuse()
    fs = slowfs.SlowFS(str(tmp_path / "mnt"), private=True).start()
    try:
        fs.kill(signal.SIGSTOP)
        code = ("import os, signal\nsignal.signal(signal.SIGUSR1, lambda *a: None)\n"
                "print('go', flush=True)\nos.statvfs(%r)\n" % fs.path)
        w = spawn(code, stdout=subprocess.PIPE, text=True)
        procs.append(w)
        assert w.stdout.readline().strip() == "go"
        # Blocked in the FUSE request (S); a caught signal turns the wait killable-only (D).
        wait_until(lambda: "wait_answer" in open("/proc/%d/wchan" % w.pid).read())
        os.kill(w.pid, signal.SIGUSR1)
        wait_until(lambda: open("/proc/%d/stat" % w.pid).read().split(") ")[1][0] == "D")
        main = subprocess.Popen(["sleep", "60"])
        procs.append(main)
        table = table_with(dict(pid=main.pid, worker_pids=[w.pid]))
        rank = table.snapshot()[0]
        ctx = context(table)
        fams = collect(workers.WorkersExporter(ctx), [rank])
        assert values(fams, "stallscope_loader_workers_dstate") == [1]
        assert values(fams, "stallscope_loader_workers_alive") == [1]
        assert ctx.samples.series(rank.key, "workers_dstate")[-1][1] == 1
        kill(w)
    finally:
        fs.stop()


TRAINER = """
import time, torch, stallscope
from torch.utils.data import DataLoader, Dataset

class Work(Dataset):
    def __len__(self):
        return 10 ** 6
    def __getitem__(self, i):
        x = 0
        for k in range(20000):  # ~1 ms of CPU per sample, in the worker
            x += k
        return torch.tensor([i])

loader = stallscope.watch(DataLoader(Work(), batch_size=4, num_workers=2, persistent_workers=True),
                          job="wk", rank=0, pod="p0")
for batch in loader:
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_real_dataloaders_workers_are_reported_per_worker(agent_factory, hook_env):
    pytest.importorskip("torch")
    agent = agent_factory("--exporter.interval", "0.3", "--exporter.workers.per-worker")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], env=hook_env(agent))
    try:
        def two_busy_workers():
            ranks = agent.api("/api/v1/ranks?job=wk")["ranks"]
            ws = ranks[0].get("workers", []) if ranks else []
            ok = len(ws) == 2 and all(w.get("cpu_seconds", 0) > 0.05 and w["rss_bytes"] > 0 for w in ws)
            return ok and ws
        ws = wait_until(two_busy_workers, timeout=60)
        for w in ws:
            assert open("/proc/%d/comm" % w["pid"]).read().startswith("pt_data_worker")
        body = agent.metrics()
        assert scraped(body, "stallscope_loader_workers_alive", job="wk", rank="0") == [2]
        assert scraped(body, "stallscope_loader_workers_cpu_seconds_total", job="wk")[0] > 0.1
        per_worker = {s: scraped(body, "stallscope_loader_worker_resident_memory_bytes", job="wk",
                                 worker=s) for s in ("0", "1")}
        assert all(v and v[0] > 0 for v in per_worker.values())
        assert len(scraped(body, "stallscope_loader_worker_cpu_seconds_total", job="wk")) == 2
    finally:
        kill(trainer)


def test_two_workers_oom_killed_before_either_exit_is_read_are_both_memory_limit(procs, tmp_path):
    # the memory cgroup's oom_kill count rises by 2 before the trainer's report of the two
    # SIGKILLed workers is read: each death accounts for one kill, neither reads 0
    main = subprocess.Popen(["sleep", "60"])
    procs.append(main)
    dead = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    procs.extend(dead)
    for p in dead:
        kill(p)
    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    table = table_with(dict(pid=main.pid, worker_pids=[p.pid for p in dead]))
    [rank] = table.snapshot()
    exp = workers.WorkersExporter(context(table))
    exp._memory_of = lambda rank: (str(tmp_path), "v2")
    collect(exp, [rank])  # the baseline: no kill yet
    events.write_text("oom 2\noom_kill 2\n")
    report = rank_message(main.pid, [p.pid for p in dead],
                          worker_exits=[[p.pid, -signal.SIGKILL] for p in dead])
    table.apply(report)
    fams = collect(exp, [rank])
    assert values(fams, "stallscope_loader_worker_exits_total", reason="memory_limit") == [2]
    assert [d["oom_kill_delta"] for d in exp.rank_fields(rank)["worker_deaths"]] == [2, 1]
    # a third SIGKILL with no new OOM kill is not one
    third = subprocess.Popen(["sleep", "60"])
    procs.append(third)
    kill(third)
    report = rank_message(main.pid, [third.pid], worker_exits=[[third.pid, -signal.SIGKILL]])
    table.apply(report)
    fams = collect(exp, [rank])
    assert values(fams, "stallscope_loader_worker_exits_total", reason="killed") == [1]
