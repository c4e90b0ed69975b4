"""shm exporter: a real size-limited tmpfs as /dev/shm of a process in its own mount
namespace (unshare -m), filled with an unlinked-but-open segment the way PyTorch leaves
them, and a real tmpfs as the node's /dev/shm (through --path.rootfs)."""
import os
import shutil
import subprocess
import sys

import pytest

from stallscope.exporters import shm
from tests.helpers import ROOT
from tests.helpers.exporters import collect, context, kill, table_with, values
from tests.helpers.needs import need_root

MiB = 1 << 20
# Write 40 MiB to /dev/shm, unlink the file but keep it open (as PyTorch does), say so.
FILL = ("import os, sys, time\n"
        "fd = os.open('/dev/shm/seg', os.O_CREAT | os.O_RDWR)\n"
        "os.unlink('/dev/shm/seg')\n"
        "for _ in range(40): os.write(fd, b'x' * (1 << 20))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")


@pytest.fixture
def rank_with_own_shm():
    need_root()
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1)")
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable, FILL]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        kill(proc)  # the mount namespace, and the tmpfs with it, go with the process


def test_a_rank_in_its_own_mount_namespace_sees_its_own_tmpfs(rank_with_own_shm):
    pid = rank_with_own_shm.pid
    table = table_with(dict(pid=pid, rank=0), dict(pid=pid, rank=1, pod="pod1"))
    ctx = context(table)
    fams = collect(shm.ShmExporter(ctx), table.snapshot())
    assert values(fams, "stallscope_shm_size_bytes", pod="pod1") == [64 * MiB]  # two ranks, one pod
    [used] = values(fams, "stallscope_shm_used_bytes", pod="pod1")
    assert 40 * MiB <= used < 41 * MiB  # invisible to ls/du, visible to statvfs
    [node_size] = values(fams, "stallscope_shm_size_bytes", pod="")
    assert node_size == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
    for r in table.snapshot():
        [(_, ratio)] = ctx.samples.series(r.key, "shm_used_ratio")
        [(_, free)] = ctx.samples.series(r.key, "shm_free_bytes")
        assert ratio == pytest.approx(used / (64 * MiB)) and free == 64 * MiB - used


@pytest.fixture
def node_root(tmp_path):
    need_root()
    shm_dir = tmp_path / "dev" / "shm"
    shm_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(shm_dir)], check=True)
    try:
        yield tmp_path
    finally:
        subprocess.run(["umount", "-l", str(shm_dir)], check=False)


def test_the_node_shm_through_rootfs(node_root):
    with open(node_root / "dev" / "shm" / "blob", "wb") as f:
        f.write(b"y" * (4 * MiB))
    ctx = context(rootfs=str(node_root))
    fams = collect(shm.ShmExporter(ctx), [])
    assert values(fams, "stallscope_shm_size_bytes", node="n1", pod="") == [16 * MiB]
    [used] = values(fams, "stallscope_shm_used_bytes", node="n1", pod="")
    assert 4 * MiB <= used < 5 * MiB
    [(_, ratio)] = ctx.samples.series("node", "shm_used_ratio")
    assert ratio == pytest.approx(used / (16 * MiB))


def test_missing_shm_is_a_note_not_a_failure(tmp_path):
    ctx = context(rootfs=str(tmp_path))
    fams = collect(shm.ShmExporter(ctx), [])
    assert values(fams, "stallscope_shm_size_bytes") == []
    assert any("no /dev/shm" in n for n in ctx.notes["shm"])


NO_PTRACE = """
import sys
from stallscope.exporters import fuse, shm
from tests.helpers.exporters import collect, context, table_with, values
table = table_with(dict(pid=int(sys.argv[1])))
ctx = context(table)
fams = collect(shm.ShmExporter(ctx))
collect(fuse.FuseExporter(ctx))
print(len(values(fams, "stallscope_shm_size_bytes", pod="pod1")), ctx.notes["shm"], ctx.notes["fuse"])
"""


def test_without_ptrace_access_the_pod_views_are_noted_not_failed():
    """The DaemonSet's base: uid 0 with every capability dropped (no CAP_SYS_PTRACE)."""
    need_root()
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv(1)")
    target = subprocess.Popen(["sleep", "60"])
    try:
        out = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--",
                              sys.executable, "-c", NO_PTRACE, str(target.pid)],
                             capture_output=True, text=True, timeout=60,
                             cwd=ROOT)
    finally:
        kill(target)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("0 ") and out.stdout.count("CAP_SYS_PTRACE") == 2, out.stdout
