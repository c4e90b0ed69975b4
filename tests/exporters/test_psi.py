"""psi exporter: the real /proc/pressure, a real cgroup2 child (under
/sys/fs/cgroup/unified on this hybrid host) throttled by a real v1 quota, and fixture
files for a pure v2 pod cgroup."""
import os

import pytest

from stallscope.exporters import psi
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


def test_node_pressure_from_the_real_proc_pressure():
    if not os.path.exists("/proc/pressure/io"):
        pytest.skip("kernel without PSI")
    ctx = context()
    exp = psi.PsiExporter(ctx)
    assert exp.unavailable() is None
    before = psi.read_dir("/proc/pressure", "")
    fams = collect(exp, [])
    after = psi.read_dir("/proc/pressure", "")
    for (res, kind), name in (((r, k), n) for r in psi.RESOURCES for k, n in psi.KINDS):
        [v] = values(fams, "stallscope_pressure_%s_%s_seconds_total" % (res, name), node="n1", pod="")
        assert before[(res, kind)] <= v <= after[(res, kind)]
    collect(exp, [])
    for signal in psi.SIGNALS.values():
        [(_, ratio)] = ctx.samples.series("node", signal)
        assert 0 <= ratio <= 1.5  # a share of wall time; rounding and scheduling jitter aside


def test_rank_cgroup_pressure_from_a_real_cgroup2_child():
    v1 = need_cpu_cgroup()
    if not os.path.exists("/sys/fs/cgroup/unified/cgroup.controllers") or \
            not os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
        pytest.skip("needs a hybrid host: v1 cpu controller and cgroup2 at /sys/fs/cgroup/unified")
    with scratch_cgroup("/sys/fs/cgroup/unified") as (u, procs), scratch_cgroup(v1) as (c, procs1):
        write(os.path.join(c, "cpu.cfs_quota_us"), "10000")  # 0.1 core: runnable, not running
        busy = spawn("while True: pass")
        procs1.append(busy)  # the inner cgroup is removed first: kill it there
        join_cgroup(u, busy)
        join_cgroup(c, busy)
        table = table_with(dict(pid=busy.pid))
        rank = table.snapshot()[0]
        ctx = context(table, cgroupfs="/sys/fs/cgroup")
        exp = psi.PsiExporter(ctx)
        first = collect(exp, [rank])
        wait_until(lambda: psi.read_dir(u, ".pressure").get(("cpu", "some"), 0) > 0.05)
        fams = collect(exp, [rank])
        lab = dict(job="job1", pod="pod1", container="/" + os.path.basename(u))
        [w0] = values(first, "stallscope_pressure_cpu_waiting_seconds_total", **lab)
        [w1] = values(fams, "stallscope_pressure_cpu_waiting_seconds_total", **lab)
        assert w1 > w0 and w1 > 0.05
        [(_, ratio)] = ctx.samples.series(rank.key, "psi_cpu_some_ratio")
        assert ratio > 0
        assert rank.cgroup.as_json()["v2"] == "/" + os.path.basename(u)


POD = "/kubepods/burstable/pod6c2a7d5e-6f8e-4c2b-9a1d-3e4f5a6b7c8d"
CID = "cd" * 32


def pressure(some, full):
    return ("some avg10=1.00 avg60=0.50 avg300=0.10 total=%d\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=%d\n" % (some, full))


def test_pod_cgroup_pressure_from_fixtures_with_exact_rates(tmp_path):
    cg, proc = tmp_path / "cgroup", tmp_path / "proc"
    cdir = cg / POD.lstrip("/") / CID
    cdir.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpu io memory\n")
    (proc / "pressure").mkdir(parents=True)
    for res in psi.RESOURCES:
        (proc / "pressure" / res).write_text(pressure(1_000_000, 0))
        (cdir / (res + ".pressure")).write_text(pressure(2_000_000, 500_000))
    for pid in (10, 11):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text("0::%s/%s\n" % (POD, CID))
    table = table_with(dict(pid=10, rank=0), dict(pid=11, rank=1), procfs=str(proc))
    ctx = context(table, procfs=str(proc), cgroupfs=str(cg))
    now = [100.0]
    ctx.clock = lambda: now[0]
    exp = psi.PsiExporter(ctx)
    fams = collect(exp, table.snapshot())
    # two ranks, one container: one series per container, plus the node's
    assert values(fams, "stallscope_pressure_io_stalled_seconds_total", container=CID) == [0.5]
    assert values(fams, "stallscope_pressure_io_waiting_seconds_total", pod="") == [1.0]
    assert len(values(fams, "stallscope_pressure_memory_waiting_seconds_total")) == 2
    (cdir / "io.pressure").write_text(pressure(2_000_000 + 300_000, 500_000 + 200_000))
    now[0] += 2.0
    collect(exp, table.snapshot())
    for r in table.snapshot():
        assert ctx.samples.series(r.key, "psi_io_some_ratio")[-1][1] == pytest.approx(0.15)
        assert ctx.samples.series(r.key, "psi_io_full_ratio")[-1][1] == pytest.approx(0.10)
        assert ctx.samples.series(r.key, "psi_memory_some_ratio")[-1][1] == 0
    assert ctx.samples.series("node", "psi_io_some_ratio")[-1][1] == 0


def test_unavailable_without_proc_pressure(tmp_path):
    reason = psi.PsiExporter(context(procfs=str(tmp_path))).unavailable()
    assert "CONFIG_PSI" in reason
