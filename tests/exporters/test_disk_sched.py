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
