"""fuse exporter against a real FUSE filesystem (mfusepy over libfuse, run as its own
process by stallscope.lab.slowfs) with injected latency, then killed (SIGKILL →
ENOTCONN) and frozen (SIGSTOP → stuck, while the agent's /metrics keeps answering).
Every mount is aborted and unmounted, and every daemon continued and reaped, in cleanup."""
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from stallscope.exporters import fuse
from stallscope.lab import slowfs
from stallscope.system import procfs
from tests.helpers import wait_until
from tests.helpers.exporters import collect, context, kill, scraped, table_with, values
from tests.helpers.needs import need_fuse

MOUNTINFO = (
    "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
    "40 22 0:39 / /mnt/s3 rw,nosuid,nodev shared:7 - fuse mountpoint-s3 rw,user_id=0\n"
    "41 22 0:40 / /mnt/my\\040data rw master:3 - fuse.gcsfuse bucket-a rw\n"
    "42 22 0:41 / /var/lib/lxcfs rw - fuse.lxcfs lxcfs rw\n"
    "43 22 0:42 /sub /mnt/jfs rw - fuse.juicefs JuiceFS:vol1 rw\n"
    "44 22 0:43 / /mnt/blob rw - fuse blobfuse2 rw\n"
    "45 22 8:17 / /mnt/ntfs rw - fuseblk /dev/sdb1 rw\n")


def test_mountinfo_and_drivers():
    ms = {m.mountpoint: m for m in procfs.parse_mountinfo(MOUNTINFO)}
    assert ms["/mnt/my data"].fstype == "fuse.gcsfuse" and ms["/mnt/jfs"].root == "/sub"
    got = {mp: fuse.driver_of(m.fstype, m.source) for mp, m in ms.items() if fuse.is_fuse(m.fstype)}
    assert got == {"/mnt/s3": "mountpoint-s3", "/mnt/my data": "gcsfuse", "/var/lib/lxcfs": "lxcfs",
                   "/mnt/jfs": "juicefs", "/mnt/blob": "blobfuse2", "/mnt/ntfs": "sdb1"}
    assert not fuse.is_fuse("fusectl") and not fuse.is_fuse("proc")
    assert fuse.driver_of("fuse", "/weird path/!!x") == "x"


@pytest.fixture
def fusectl():
    need_fuse()
    mounted = slowfs.ensure_fusectl()
    try:
        yield
    finally:
        if mounted:
            subprocess.run(["umount", slowfs.FUSECTL], check=False)


@pytest.fixture
def mounts(fusectl, tmp_path):
    made = []

    def make(**kw):
        # in a mount namespace of its own: other agents on this machine never probe it
        fs = slowfs.SlowFS(str(tmp_path / ("mnt%d" % len(made))), private=True, **kw)
        made.append(fs)
        return fs.start()

    yield make
    for fs in made:
        fs.stop()


@pytest.fixture
def rank_in():
    """A rank's main process inside a mount's namespace (killed afterwards)."""
    made = []

    def start(fs):
        made.append(fs.popen(["sleep", "120"]))
        return made[-1]

    yield start
    for p in made:
        kill(p)


def mine(exp, rank, fs):
    return [m for m in exp.mounts_of[rank.key] if m["mountpoint"] == fs.mountpoint]


def exporter(table, probe_timeout=3.0):
    ctx = context(table)
    exp = fuse.FuseExporter(ctx, fuse.FuseOptions(probe_timeout=probe_timeout))
    exp.deadline = 2 * probe_timeout + 1
    return ctx, exp


def test_probe_latency_and_waiting_follow_injected_latency(mounts, rank_in):
    latency = 0.4
    fs = mounts(latency=latency, fsname="mountpoint-s3")
    rank_proc = rank_in(fs)
    table = table_with(dict(pid=rank_proc.pid))
    ctx, exp = exporter(table)
    lab = dict(mountpoint=fs.mountpoint, fstype="fuse", driver="mountpoint-s3", pod="pod1")
    idle = collect(exp, table.snapshot())
    assert values(idle, "stallscope_fuse_up", **lab) == [1]
    assert values(idle, "stallscope_fuse_waiting_requests", **lab) == [0]
    assert values(idle, "stallscope_fuse_probe_seconds", **lab)[0] >= latency
    stop = threading.Event()

    def reader(i):
        while not stop.is_set():
            with open(os.path.join(fs.path, "file%03d" % i), "rb") as f:
                f.read(4096)

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in readers:
        t.start()
    try:
        wait_until(lambda: int(open(os.path.join(fs.connection(), "waiting")).read()) >= 4)
        busy = collect(exp, table.snapshot())
    finally:
        stop.set()
        for t in readers:
            t.join()
    [w] = values(busy, "stallscope_fuse_waiting_requests", **lab)
    [secs] = values(busy, "stallscope_fuse_probe_seconds", **lab)
    assert w >= 2 and latency <= secs < 3.0
    rank = table.snapshot()[0]
    assert ctx.samples.series(rank.key, "fuse_waiting_requests")[-1][1] == w
    assert ctx.samples.series(rank.key, "fuse_probe_seconds")[-1][1] == secs
    assert [m["state"] for m in mine(exp, rank, fs)] == ["up"]


def test_a_killed_daemon_is_reported_enotconn(mounts, rank_in):
    fs = mounts(subtype="gcsfuse")
    rank_proc = rank_in(fs)
    table = table_with(dict(pid=rank_proc.pid))
    ctx, exp = exporter(table)
    lab = dict(mountpoint=fs.mountpoint, fstype="fuse.gcsfuse", driver="gcsfuse")
    assert values(collect(exp, table.snapshot()), "stallscope_fuse_up", **lab) == [1]
    fs.kill(signal.SIGKILL)
    fs.proc.wait()
    with pytest.raises(OSError) as e:
        os.statvfs("/proc/%d/root%s" % (rank_proc.pid, fs.mountpoint))  # the daemon's /proc is gone
    assert e.value.errno == errno.ENOTCONN
    fams = collect(exp, table.snapshot())
    assert values(fams, "stallscope_fuse_up", **lab) == [0]
    assert values(fams, "stallscope_fuse_probe_failures_total", reason="ENOTCONN", **lab) == [1]
    rank = table.snapshot()[0]
    assert [m["state"] for m in mine(exp, rank, fs)] == ["disconnected"]
    assert ctx.samples.series(rank.key, "fuse_up")[-1][1] == 0
    fams = collect(exp, table.snapshot())  # every failed probe counts
    assert values(fams, "stallscope_fuse_probe_failures_total", reason="ENOTCONN", **lab) == [2]


TRAINER = """
import time, stallscope
for _ in stallscope.watch(iter(range(10 ** 9)), job="fusejob", rank=0, pod="p0"):
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_frozen_daemon_is_stuck_and_metrics_still_answer(mounts, agent_factory, hook_env):
    fs = mounts(fsname="blobfuse2")
    agent = agent_factory("--exporter.interval", "0.3", "--exporter.fuse.probe-timeout", "0.5",
                          "--exporter.timeout", "2")
    trainer = fs.popen([sys.executable, "-c", TRAINER], env=hook_env(agent))
    lab = dict(job="fusejob", pod="p0", mountpoint=fs.mountpoint, driver="blobfuse2")
    try:
        wait_until(lambda: scraped(agent.metrics(), "stallscope_fuse_up", **lab) == [1], timeout=30)
        fs.kill(signal.SIGSTOP)
        stuck_since = None
        waiting_seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            # /metrics never waits on the mount: the bound is one second.
            body = urllib.request.urlopen(agent.url + "/metrics", timeout=1.0).read().decode()
            assert time.monotonic() - t0 < 1.0
            if scraped(body, "stallscope_fuse_up", **lab) == [0]:
                stuck_since = stuck_since or time.monotonic()
                waiting_seen += scraped(body, "stallscope_fuse_waiting_requests", **lab)
                if time.monotonic() - stuck_since > 1.5:  # several collections while stuck
                    break
            time.sleep(0.1)
        assert stuck_since is not None, "the frozen mount was never reported stuck"
        assert scraped(body, "stallscope_fuse_probe_failures_total", reason="stuck", **lab) == [1]
        assert scraped(body, "stallscope_exporter_success", exporter="fuse") == [1]
        # One outstanding probe, never re-issued: the connection holds exactly one request
        # (read before each collection's probes, so the first stuck report may say 0).
        assert waiting_seen[-1] == 1 and max(waiting_seen) == 1
        ranks = agent.api("/api/v1/ranks")["ranks"]
        assert [m["state"] for m in ranks[0]["fuse"] if m["mountpoint"] == fs.mountpoint] == ["stuck"]
    finally:
        kill(trainer)
        fs.kill(signal.SIGCONT)
