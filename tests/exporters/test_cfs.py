"""cfs exporter: a real v1 cpu cgroup with a CFS quota holding a busy loader worker
(root; skips elsewhere), and cgroup v2 shapes from fixture files."""
import os
import subprocess
import time

import pytest

from stallscope.exporters import cfs
from stallscope.host.facts import RankQuota
from tests.helpers import wait_until
from tests.helpers.exporters import (
    collect,
    context,
    join_cgroup,
    scratch_cgroup,
    spawn,
    table_with,
    values,
    write,
)
from tests.helpers.needs import need_cpu_cgroup

BUSY = "while True: pass"


@pytest.fixture
def v1_cpu_cgroup():
    base = need_cpu_cgroup()
    if not os.path.exists(os.path.join(base, "cpu.cfs_quota_us")):
        pytest.skip("needs the cgroup v1 cpu controller (this host is cgroup v2 only)")
    with scratch_cgroup(base) as made:
        yield made


def stat(path):
    return cfs.parse_stat(cfs.read_keyed(os.path.join(path, "cpu.stat")), 1)


def test_throttling_of_a_busy_worker_matches_cpu_stat(v1_cpu_cgroup):
    path, procs = v1_cpu_cgroup
    write(os.path.join(path, "cpu.cfs_period_us"), "100000")
    write(os.path.join(path, "cpu.cfs_quota_us"), "20000")  # 0.2 cores
    main = subprocess.Popen(["sleep", "60"])
    procs.append(main)
    busy = spawn(BUSY)
    procs.append(busy)
    join_cgroup(path, busy)
    table = table_with(dict(pid=main.pid, worker_pids=[busy.pid]))
    rank = table.snapshot()[0]
    ctx = context(table, cgroupfs="/sys/fs/cgroup")
    exp = cfs.CfsExporter(ctx)
    assert exp.unavailable() is None
    collect(exp, [rank])
    wait_until(lambda: stat(path)[1] >= 3)  # throttled in a few periods
    before = stat(path)
    fams = collect(exp, [rank])
    after = stat(path)
    container = "/" + os.path.basename(path)
    lab = dict(job="job1", pod="pod1", namespace="ns1", node="n1", container=container)
    [thr] = values(fams, "stallscope_cpu_cfs_throttled_periods_total", **lab)
    [per] = values(fams, "stallscope_cpu_cfs_periods_total", **lab)
    [sec] = values(fams, "stallscope_cpu_cfs_throttled_seconds_total", **lab)
    assert before[1] <= thr <= after[1] and thr >= 3
    assert before[0] <= per <= after[0]
    assert before[2] <= sec <= after[2] and sec > 0
    # the main process sits in the root cgroup, which has no quota: one series only
    assert len(values(fams, "stallscope_cpu_cfs_periods_total")) == 1
    assert values(fams, "stallscope_cpu_cfs_quota_cores", **lab) == [0.2]
    assert values(fams, "stallscope_cpu_cfs_quota_oversubscribed", **lab) == [1]
    [(_, ratio)] = ctx.samples.series(rank.key, "cfs_throttled_ratio")
    [(_, rate)] = ctx.samples.series(rank.key, "cfs_throttled_seconds_rate")
    assert 0 < ratio <= 1 and rate > 0
    assert ctx.facts.value(RankQuota, rank.key).cores == 0.2
    assert rank.cgroup.as_json()["v1"]["cpu"] == "/"


def test_quota_against_main_plus_workers_and_shared_by_ranks(v1_cpu_cgroup):
    path, procs = v1_cpu_cgroup
    write(os.path.join(path, "cpu.cfs_quota_us"), "200000")
    write(os.path.join(path, "cpu.cfs_period_us"), "100000")  # 2 cores
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(5)]
    procs.extend(sleepers)
    for p in sleepers:
        join_cgroup(path, p)
    r0 = dict(pid=sleepers[0].pid, worker_pids=[sleepers[1].pid, sleepers[2].pid], rank=0)
    r1 = dict(pid=sleepers[3].pid, worker_pids=[sleepers[4].pid], rank=1)
    table = table_with(r0, r1)
    ranks = table.snapshot()
    exp = cfs.CfsExporter(context(table, cgroupfs="/sys/fs/cgroup"))
    fams = collect(exp, ranks)
    assert values(fams, "stallscope_cpu_cfs_quota_cores") == [2.0]
    assert values(fams, "stallscope_cpu_cfs_quota_oversubscribed") == [1]  # 5 processes > 2 cores
    assert [exp.host.facts.value(RankQuota, r.key).ranks for r in ranks] == [2, 2]
    write(os.path.join(path, "cpu.cfs_quota_us"), "800000")  # 8 cores
    fams = collect(exp, ranks)
    assert values(fams, "stallscope_cpu_cfs_quota_oversubscribed") == [0]
    assert [exp.host.facts.value(RankQuota, r.key).cores for r in ranks] == [8.0, 8.0]


POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice" % (
    "6c2a7d5e_6f8e_4c2b_9a1d_3e4f5a6b7c8d")
CID = "ab" * 32


def test_cgroup_v2_files_from_fixtures(tmp_path):
    """Pure v2 host: µs counters, cpu.max along ancestors, absent keys tolerated."""
    cg, proc = tmp_path / "cgroup", tmp_path / "proc"
    container = POD + "/cri-containerd-%s.scope" % CID
    cdir = cg / container.lstrip("/")
    cdir.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cg / POD.lstrip("/") / "cpu.max").write_text("300000 100000\n")  # pod: 3 cores
    (cdir / "cpu.max").write_text("max 100000\n")                     # container: none
    (cdir / "cpu.stat").write_text("usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n"
                                   "nr_periods 500\nnr_throttled 120\nthrottled_usec 2500000\n")
    for pid, path in ((4242, container), (4243, container), (4244, "/")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text("0::%s\n" % path)
    table = table_with(dict(pid=4242, worker_pids=[4243, 4244]), procfs=str(proc))
    ctx = context(table, cgroupfs=str(cg), procfs=str(proc))
    exp = cfs.CfsExporter(ctx)
    assert exp.unavailable() is None
    fams = collect(exp, table.snapshot())
    lab = dict(container=CID, pod="pod1")
    assert values(fams, "stallscope_cpu_cfs_throttled_seconds_total", **lab) == [2.5]
    assert values(fams, "stallscope_cpu_cfs_throttled_periods_total", **lab) == [120]
    assert values(fams, "stallscope_cpu_cfs_quota_cores", **lab) == [3.0]
    assert values(fams, "stallscope_cpu_cfs_quota_oversubscribed", **lab) == [0]  # 2 procs here
    rank = table.snapshot()[0]
    assert rank.cgroup.as_json()["container_id"] == CID
    # the cpu controller not enabled for the cgroup: no nr_* keys, no series, a note
    (cdir / "cpu.stat").write_text("usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n")
    assert values(collect(exp, table.snapshot()), "stallscope_cpu_cfs_periods_total") == []
    assert any("no CFS counters" in n for n in ctx.notes["cfs"])


def test_unavailable_without_a_cpu_controller(tmp_path):
    (tmp_path / "memory").mkdir()
    reason = cfs.CfsExporter(context(cgroupfs=str(tmp_path))).unavailable()
    assert reason and "no cpu cgroup controller" in reason


def _run_delay(pid):
    """Seconds ``pid`` waited runnable on a run queue, throttled included (the kernel's
    own record: /proc/<pid>/schedstat, Documentation/scheduler/sched-stats.rst)."""
    with open("/proc/%d/schedstat" % pid) as f:
        return int(f.read().split()[1]) / 1e9


@pytest.mark.parametrize("pinned", [False, True])
def test_held_back_share_is_each_workers_throttled_time(v1_cpu_cgroup, pinned):
    """Three busy workers under a 0.3-core quota. The kernel adds the cgroup's throttled
    time once per CPU it throttled on: ~1.6 s a second over this machine's two CPUs, and
    each worker was held back for its CPU's whole span, ~0.8, not the rate per worker.
    Checked against each worker's run-queue wait (run_delay), which is the throttled
    span plus the others' turns on its CPU while the quota lets them run: ~0.1 on two
    CPUs, (1 - held) x 2/3 when all three are pinned to one."""
    path, procs = v1_cpu_cgroup
    write(os.path.join(path, "cpu.cfs_period_us"), "100000")
    write(os.path.join(path, "cpu.cfs_quota_us"), "30000")
    main = subprocess.Popen(["sleep", "60"])
    procs.append(main)
    workers = [spawn(BUSY) for _ in range(3)]
    procs.extend(workers)
    for w in workers:
        if pinned:  # one CPU: one cfs_rq throttles, and the rate is the held-back share
            os.sched_setaffinity(w.pid, {0})
        join_cgroup(path, w)
    table = table_with(dict(pid=main.pid, worker_pids=[w.pid for w in workers]))
    rank = table.snapshot()[0]
    ctx = context(table, cgroupfs="/sys/fs/cgroup")
    exp = cfs.CfsExporter(ctx)
    collect(exp, [rank])
    delay0, t0 = [_run_delay(w.pid) for w in workers], time.monotonic()
    time.sleep(2.0)
    collect(exp, [rank])
    delay1, t1 = [_run_delay(w.pid) for w in workers], time.monotonic()
    [(_, held)] = ctx.samples.series(rank.key, "cfs_held_back_ratio")
    [(_, rate)] = ctx.samples.series(rank.key, "cfs_throttled_seconds_rate")
    waited = sum(b - a for a, b in zip(delay0, delay1)) / len(workers) / (t1 - t0)
    print("rate %.2f s/s, held back %.2f, run-queue wait %.2f a worker" % (rate, held, waited))
    if pinned:
        assert held == pytest.approx(rate)
        # the others' turns while the quota lets them run: (1 - held) x 2/3; more only
        # where other tasks on the machine take CPU 0 too
        assert held + (1 - held) * 2 / 3 - 0.05 <= waited, (held, waited)
    else:
        assert held == pytest.approx(rate / 2), rate
        # the held-back span is in the wait, and the rest of the wait fits in the span the
        # quota let the group run, less the worker's own 0.1 of a core
        assert held <= waited + 0.03 and waited - held <= (1 - held) - 0.1 + 0.03, (held, waited)
        if rate > 1.2:  # both CPUs throttled most of the time (a busy machine throttles
            # less: the others take the workers' turns before their quota runs out), and
            # the rate per worker, read before, is far under each one's wait
            assert rate / 3 < waited - 0.3, (rate, waited)
