"""disk and sched exporters: real fsync'd writes on the real /proc/diskstats, fixture
files, and real crowded processes' /proc/<pid>/schedstat."""
import os

import pytest

from stallscope.exporters import disk
from tests.helpers.exporters import collect, context, write


def test_only_whole_physical_devices_count(tmp_path):
    os.makedirs(tmp_path / "proc")
    write(str(tmp_path / "proc" / "diskstats"),
          " 253 0 vda 10 0 80 5 20 0 1000 9 0 10 14 0 0 0 0\n"
          " 253 1 vda1 10 0 80 5 20 0 900 9 0 10 14 0 0 0 0\n"
          " 7 0 loop0 1 0 8 0 0 0 0 0 0 0 0\n"
          " 252 0 dm-0 1 0 8 0 2 0 700 0 0 0 0\n")
    for dev in ("vda", "loop0", "dm-0"):
        os.makedirs(tmp_path / "sys" / "block" / dev)
    os.makedirs(tmp_path / "sys" / "block" / "vda" / "device")
    ctx = context(procfs=str(tmp_path / "proc"), sysfs=str(tmp_path / "sys"))
    now = [100.0]
    ctx.clock = lambda: now[0]
    exp = disk.DiskExporter(ctx)
    assert exp.unavailable() is None
    assert collect(exp, []) == []
    assert ctx.samples.series("node", "disk_write_bytes_rate") == []  # first reading: no rate
    write(str(tmp_path / "proc" / "diskstats"),
          " 253 0 vda 10 0 80 5 20 0 3000 9 0 10 14 0 0 0 0\n"
          " 253 1 vda1 10 0 80 5 20 0 2900 9 0 10 14 0 0 0 0\n"
          " 252 0 dm-0 1 0 8 0 2 0 9700 0 0 0 0\n")
    now[0] = 102.0
    collect(exp, [])
    [(_, rate)] = ctx.samples.series("node", "disk_write_bytes_rate")
    assert rate == 2000 * 512 / 2.0


def test_real_fsynced_writes_show_in_the_rate(tmp_path):
    ctx = context()
    exp = disk.DiskExporter(ctx)
    if exp.unavailable() or not exp._physical():
        pytest.skip("no /proc/diskstats or no physical block device")
    here = os.path.dirname(os.path.abspath(__file__))
    st = os.stat(here)
    dev = "/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    if not (os.path.exists(dev + "/device") or os.path.exists(dev + "/../device")):
        pytest.skip("the test directory is not on a physical block device (%s)" % dev)
    target = os.path.join(here, ".disk-exporter-test")
    collect(exp, [])
    t0 = ctx.clock()
    try:
        with open(target, "wb") as f:
            for _ in range(16):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.unlink(target)
    collect(exp, [])
    dt = ctx.clock() - t0
    [(_, rate)] = ctx.samples.series("node", "disk_write_bytes_rate")
    assert rate * dt >= 0.9 * 16 * (1 << 20)  # others may write too: a lower bound


def test_sched_run_queue_wait_of_real_crowded_workers():
    """Two busy loops pinned to one CPU: each waits on the run queue about half the time."""
    import time

    from stallscope.exporters import sched
    from tests.helpers.exporters import spawn, table_with

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    cpu = sorted(os.sched_getaffinity(0))[0]
    code = "import os; os.sched_setaffinity(0, {%d})\nwhile True: pass" % cpu
    workers = [spawn(code), spawn(code)]
    try:
        table = table_with(dict(pid=os.getpid(), worker_pids=[w.pid for w in workers]))
        ctx = context(table)
        exp = sched.SchedExporter(ctx)
        assert exp.unavailable() is None
        rank = table.snapshot()[0]
        time.sleep(0.3)
        collect(exp, [rank])
        time.sleep(1.0)
        collect(exp, [rank])
        [(_, ratio)] = ctx.samples.series(rank.key, "workers_runqueue_ratio")
        # two on one CPU: each runnable all the time, running about half of it (other
        # tasks on that CPU only add to the wait)
        assert 0.3 <= ratio <= 1.05
    finally:
        for w in workers:
            w.kill()
            w.wait()
    # this test process sleeps: next to no run-queue wait
    idle = table_with(dict(pid=os.getpid(), worker_pids=[os.getpid()]))
    ctx2 = context(idle)
    exp2 = sched.SchedExporter(ctx2)
    r = idle.snapshot()[0]
    collect(exp2, [r])
    time.sleep(0.5)
    collect(exp2, [r])
    [(_, mine)] = ctx2.samples.series(r.key, "workers_runqueue_ratio")
    assert mine < 0.3


def test_sched_node_idle_cores_from_proc_stat(tmp_path):
    """The node's idle CPUs (the cores capacity of the predictions): idle + iowait ticks of
    /proc/stat's cpu line a second, in cores; a fixture's exact value, then the real file."""
    from stallscope.exporters import sched

    os.makedirs(tmp_path / "proc")
    line = "cpu  10132153 290696 3084719 %d %d 0 25195 0 0 0\ncpu0 1 2 3 4 5 0 0 0 0 0\nbtime 1\n"
    write(str(tmp_path / "proc" / "stat"), line % (46828483, 16683))
    ctx = context(procfs=str(tmp_path / "proc"))
    now = [100.0]
    ctx.clock = lambda: now[0]
    exp = sched.SchedExporter(ctx)
    collect(exp, [])
    assert ctx.samples.series("node", "node_cpu_idle_cores") == []  # first reading: no rate
    # 2 s later: 150 ticks idle and 50 in iowait, 2 s of one CPU's time over 2 s: 1 core
    write(str(tmp_path / "proc" / "stat"), line % (46828483 + 150, 16683 + 50))
    now[0] = 102.0
    collect(exp, [])
    [(_, idle)] = ctx.samples.series("node", "node_cpu_idle_cores")
    assert idle == pytest.approx(200 / sched.USER_HZ / 2.0)
    assert sched.idle_ticks("cpu0 1 2 3 4 5\n") is None and sched.idle_ticks("cpu  1 2 3\n") is None

    real = context()
    if not os.path.exists(os.path.join(real.procfs, "stat")):
        pytest.skip("no /proc/stat")
    exp = sched.SchedExporter(real)
    collect(exp, [])
    import time
    time.sleep(0.5)
    collect(exp, [])
    [(_, idle)] = real.samples.series("node", "node_cpu_idle_cores")
    # never more than the node's CPUs (a tick's rounding either side over 0.5 s)
    assert 0.0 <= idle <= os.cpu_count() * 1.05 + 0.05
