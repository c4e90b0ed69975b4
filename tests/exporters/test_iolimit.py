"""iolimit exporter: a real v1 blkio cgroup with a read limit on a real disk (root; skips
elsewhere), the tightest along the ancestors, and io.max's v2 shape."""
import os
import subprocess

import pytest

from stallscope.exporters import iolimit
from stallscope.host.facts import RankIoLimit
from tests.helpers.exporters import collect, context, join_cgroup, scratch_cgroup, table_with, write
from tests.helpers.needs import need_root

BLKIO = "/sys/fs/cgroup/blkio"


def _disk():
    """MAJ:MIN of a real disk of this machine (not a loop or zram device)."""
    for name in sorted(os.listdir("/sys/block")):
        if name.startswith(("loop", "zram", "ram")):
            continue
        with open(os.path.join("/sys/block", name, "dev")) as f:
            return f.read().strip()
    pytest.skip("no disk in /sys/block")


@pytest.fixture
def blkio_cgroup():
    need_root()
    if not os.path.exists(os.path.join(BLKIO, "blkio.throttle.read_bps_device")):
        pytest.skip("needs the cgroup v1 blkio controller")
    with scratch_cgroup(BLKIO) as made:
        yield made


def test_the_rank_cgroups_read_limit_is_published_as_the_kernel_holds_it(blkio_cgroup):
    path, procs = blkio_cgroup
    disk = _disk()
    write(os.path.join(path, "blkio.throttle.read_bps_device"), "%s 20000000" % disk)
    child = os.path.join(path, "inner")
    os.mkdir(child)
    try:
        write(os.path.join(child, "blkio.throttle.read_bps_device"), "%s 50000000" % disk)
        main = subprocess.Popen(["sleep", "60"])
        procs.append(main)
        join_cgroup(child, main)
        table = table_with(dict(pid=main.pid, worker_pids=[]))
        rank = table.snapshot()[0]
        ctx = context(table, cgroupfs="/sys/fs/cgroup")
        exp = iolimit.IoLimitExporter(ctx)
        assert exp.unavailable() is None
        assert collect(exp, [rank]) == []  # a host fact, no family
        # the kernel's record: each file as it reads back; the parent's is the tighter
        with open(os.path.join(path, "blkio.throttle.read_bps_device")) as f:
            parent = iolimit.parse_v1(f.read())
        assert parent == 20e6
        assert ctx.facts.value(RankIoLimit, rank.key) == RankIoLimit(parent)
        # no limit anywhere along the way: None (not measured would be no fact at all)
        write(os.path.join(path, "blkio.throttle.read_bps_device"), "%s 0" % disk)
        write(os.path.join(child, "blkio.throttle.read_bps_device"), "%s 0" % disk)
        collect(exp, [rank])
        assert ctx.facts.value(RankIoLimit, rank.key) == RankIoLimit(None)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        procs.clear()
        os.rmdir(child)


def test_io_max_lines_give_the_tightest_read_limit():
    text = "8:0 rbps=2097152 wbps=max riops=max wiops=max\n259:0 rbps=max wbps=1000 riops=10 wiops=max\n"
    assert iolimit.parse_v2(text) == 2097152.0
    assert iolimit.parse_v2("8:0 rbps=max wbps=max riops=max wiops=max") is None
    assert iolimit.parse_v2("") is None and iolimit.parse_v2(None) is None
    assert iolimit.parse_v1("8:0 1048576\n254:0 4096\n") == 4096.0
    assert iolimit.parse_v1("garbage line\n8:0 notanumber") is None
