"""Storage faults: slow or dead FUSE mounts, a cold cache, a storage server saturated by
checkpoint uploads. Each changes where the target rank's samples come from (its plan's
``source``, read by lab/sources.py in the loader workers)."""
import os
import shutil
import signal
import sys

from ...processes import children, servers, teardown
from .. import sources
from .base import Fault


class SlowFuse(Fault):
    needs = ("root", "fuse")

    def __init__(self, latency=0.01, tail_every=100, tail_latency=1.0, brownouts=None, timed=True,
                 contention=None):
        self.latency, self.tail_every, self.tail_latency = latency, tail_every, tail_latency
        self.contention = contention  # (seconds, bytes/s): see slowfs.py --contention
        # timed False: the rank reads with plain open()/read() and reports no read (no
        # adapter), as a trainer with only the two public lines does (issue 30)
        self.timed = timed
        self.brownouts = brownouts  # (every, for, latency) seconds: see slowfs.py
        self.fs = None
        self.summary = "the target rank reads its shards through a FUSE mount that adds %.3g ms per " \
            "operation" % (latency * 1000)
        if tail_every:
            self.summary += ", and %.1f s to every %dth read (an object store's tail)" % (
                tail_latency, tail_every)
        if brownouts:
            self.summary += ", and %.0f ms during %gs brownouts every %gs" % (
                brownouts[2] * 1000, brownouts[1], brownouts[0])
        if contention:
            self.summary += (", up to %.0f ms more while the node's disks write (at %.0f MB/s and over)"
                             % (contention[0] * 1000, contention[1] / 1e6))
        if not timed:
            self.summary += ", read with plain open()/read(): no read is reported"

    def prepare(self, run):
        from ..slowfs import SlowFS, ensure_fusectl

        # fusectl gives the agent the mount's count of waiting requests, and lets the
        # teardown abort a stuck connection.
        run.td.push("unmount fusectl", _umount_fusectl, ensure_fusectl())
        mnt = os.path.join(run.workdir, "fuse-shards")
        src = run.plans[run.target]["source"]
        # In a mount namespace of its own (as a pod's mounts are), made inside the target's
        # lab node where it has one (its mounts, its network); the target rank enters it.
        node = run.node(run.target) if hasattr(run, "node") else None
        self.fs = SlowFS(mnt, latency=self.latency, files=src["shards"], size=src["shard_bytes"],
                         fsname="lab-objectstore", private=True, tail_every=self.tail_every,
                         tail_latency=self.tail_latency, brownouts=self.brownouts,
                         popen_kwargs=children.session_kwargs(), contention=self.contention,
                         prefix=node.enter() if node is not None else ())
        run.td.push("unmount %s" % mnt, self.fs.stop)
        run.created("mount", mnt)
        self.fs.start()
        run.created("pgid", self.fs.proc.pid)
        src.update(dir=mnt, pattern="file%03d", direct=False, timed=self.timed)

    def enter(self):
        return self.fs.enter([])

    def own_mounts(self):
        return (self.fs.mountpoint,)


def _umount_fusectl(mounted_by_us):
    if mounted_by_us:
        import subprocess

        from ..slowfs import FUSECTL

        subprocess.run(["umount", FUSECTL], check=False)


class DeadFuse(SlowFuse):
    def __init__(self, latency=0.002, kill_at=0.35):
        super().__init__(latency, tail_every=0)
        self.kill_at = kill_at
        self.killed = False
        self.summary = ("the FUSE daemon under the target rank's shards is SIGKILLed after %d%% of the run: "
                        "reads fail with ENOTCONN, the loader retries and skips" % (kill_at * 100))

    def tick(self, run, elapsed):
        if not self.killed and elapsed >= self.kill_at * run.duration:
            self.killed = True
            self.fs.kill(signal.SIGKILL)
            run.say("fault: killed the FUSE daemon (pid %d) under rank %d's shards" % (
                self.fs.proc.pid, run.target))


class FrozenFuse(SlowFuse):
    """The FUSE daemon under the target rank's shards stops answering (SIGSTOP) mid-run:
    a worker's next read waits in D state for good and the rank hangs in next()."""

    def __init__(self, latency=0.002, freeze_at=0.3):
        super().__init__(latency, tail_every=0)
        self.freeze_at = freeze_at
        self.frozen = False
        self.summary = ("the FUSE daemon under the target rank's shards is frozen (SIGSTOP) after "
                        "%d%% of the run: a read never returns and the rank hangs in next()"
                        % (freeze_at * 100))

    def tick(self, run, elapsed):
        if not self.frozen and elapsed >= self.freeze_at * run.duration:
            self.frozen = True
            self.fs.kill(signal.SIGSTOP)  # SlowFS.stop() continues it and aborts the connection
            run.say("fault: froze the FUSE daemon (pid %d) under rank %d's shards" % (
                self.fs.proc.pid, run.target))


def start_objstore(run, latency=0.0, bandwidth_mbps=0.0, brownouts=None):
    """The lab's object store over the shard directory; returns its URL. ``brownouts``:
    (every, for, latency) seconds, see objstore.py."""
    port = servers.free_port()
    extra = []
    if brownouts:
        extra = ["--slow-every", str(brownouts[0]), "--slow-for", str(brownouts[1]),
                 "--slow-latency", str(brownouts[2])]
    run.spawn("objstore", [sys.executable, "-m", "stallscope.lab.objstore", run.shard_dir, str(port),
                           "--latency", str(latency), "--bandwidth", str(bandwidth_mbps)] + extra)
    url = "http://127.0.0.1:%d" % port
    if not teardown.wait_for(lambda: http_up(url), 15):
        raise RuntimeError("the lab object store did not start:\n" + run.log_tail("objstore"))
    return url


class RemoteShards(Fault):
    """The target rank reads every sample from the lab's object store, no local copy and
    no cache: its shards live behind a remote endpoint while the other ranks read local
    files. The endpoint answers in ``latency`` seconds, and in ``slow_latency`` during
    brownouts of ``slow_for`` seconds every ``every`` (a degraded gateway)."""

    def __init__(self, latency=0.005, every=12.0, slow_for=5.0, slow_latency=0.1):
        self.latency, self.brownouts = latency, (every, slow_for, slow_latency)
        self.summary = ("the target rank reads every sample from an object store endpoint that "
                        "answers in %.0f ms, and in %.0f ms during %gs brownouts every %gs (no "
                        "local copy, no cache)" % (latency * 1000, slow_latency * 1000, slow_for, every))

    def prepare(self, run):
        url = start_objstore(run, latency=self.latency, brownouts=self.brownouts)
        plan = run.plans[run.target]
        plan["source"] = {"kind": "cached", "cache_dir": None, "remote_url": url,
                          "shards": plan["source"]["shards"], "read_bytes": plan["source"]["read_bytes"]}


# Writes a file of ``mib`` MiB over and over at ``mbps`` MB/s, each 4 MiB chunk flushed
# with fdatasync: what a log shipper or another pod's writer does to a node's disk.
_WRITER = """import os, sys, time
path, mbps, mib = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
chunk = 4 << 20
buf = os.urandom(chunk)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
t0, n = time.monotonic(), 0
while True:
    os.pwrite(fd, buf, (n % max(1, mib // 4)) * chunk)
    os.fdatasync(fd)
    n += 1
    ahead = t0 + n * chunk / (mbps * 1e6) - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
"""


_BURSTS = """import os, sys, time
path, mib, every, mbps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
chunk = 4 << 20
buf = os.urandom(chunk)
t0 = time.monotonic()
while True:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    start = time.monotonic()
    for n in range(mib // 4):
        os.pwrite(fd, buf, n * chunk)
        os.fdatasync(fd)
        ahead = start + (n + 1) * chunk / (mbps * 1e6) - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    os.close(fd)
    os.unlink(path)
    t0 += every
    time.sleep(max(0.0, t0 - time.monotonic()))
"""


class DiskCheckpoints(Fault):
    """A checkpoint of ``mib`` MiB written to the node's disk every ``every`` seconds at
    ``mbps`` MB/s (fdatasync every 4 MiB), by a process outside every pod (the trainer's
    checkpointing sidecar, another job's): write bursts the node's disk write rate shows.
    Not a fault of any rank; the backdrop of one whose reads share the device (Combined
    with a SlowFuse whose ``contention`` follows the node's writes)."""

    needs = ("disk",)

    def __init__(self, mib=400, every=12.0, mbps=100.0):
        self.mib, self.every, self.mbps = mib, every, mbps
        self.summary = ("a %d MiB checkpoint written to the node's disk every %gs at %g MB/s" % (
            mib, every, mbps))

    def prepare(self, run):
        path = os.path.join(run.workdir, "checkpoint.bin")
        run.td.push("remove %s" % path, _unlink, path)
        run.spawn("checkpoints", [sys.executable, "-c", _BURSTS, path, str(self.mib), str(self.every),
                                  str(self.mbps)])


class NodeWriter(Fault):
    """A process outside every pod writes to the node's disk all along (``mbps`` MB/s,
    flushed every 4 MiB): node-wide I/O that the node's PSI and disk write rate show.
    Not a fault of any rank; a backdrop for one (Combined)."""

    needs = ("disk",)

    def __init__(self, mbps=40.0, mib=64):
        self.mbps, self.mib = mbps, mib
        self.summary = "a process outside the pods writes %g MB/s to the node's disk (fdatasync " \
            "every 4 MiB)" % mbps

    def prepare(self, run):
        path = os.path.join(run.workdir, "node-writer.bin")
        run.td.push("remove %s" % path, _unlink, path)
        run.spawn("node-writer", [sys.executable, "-c", _WRITER, path, str(self.mbps), str(self.mib)])


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class CheckpointBurst(Fault):
    # every: start to start. A 512 MiB checkpoint takes 2.7 s at the store's 200 MB/s and up
    # to ~5 s when the disk behind it is slower (a busy shared machine); every 10 s leaves
    # quiet time between bursts either way, so the stalls come and go with the writes
    # instead of blurring into a steady slowdown.
    def __init__(self, mib=512, every=10.0, bandwidth_mbps=200.0, read_kib=256, reads=4):
        self.mib, self.every, self.bandwidth = mib, every, bandwidth_mbps
        self.read_kib, self.reads = read_kib, reads
        self.summary = ("%d MiB checkpoints every %gs over 8 streams to the storage server (%g MB/s "
                        "shared, written through to its disk) the target rank reads its shards from" % (
                            mib, every, bandwidth_mbps))

    def prepare(self, run):
        url = start_objstore(run, latency=0.002, bandwidth_mbps=self.bandwidth)
        # Samples of 4 reads of 256 KiB: each read stays fast enough (~2 ms, ~15 ms during a
        # checkpoint), what the checkpoint takes away is the loader's throughput.
        plan = run.plans[run.target]
        plan["reads_per_sample"] = self.reads
        plan["source"] = {"kind": "cached", "cache_dir": None, "remote_url": url,
                          "shards": plan["source"]["shards"], "read_bytes": self.read_kib * 1024}
        run.spawn("checkpointer", [sys.executable, "-m", "stallscope.lab.checkpointer", url,
                                   "--mib", str(self.mib), "--every", str(self.every)])


class ColdCache(Fault):
    RUN = 96  # samples read from one shard in a row (12 batches)

    def __init__(self, latency=0.03, cached_every=3, timed=True):
        self.latency, self.cached_every = latency, cached_every
        self.timed = timed  # False: plain reads and GETs, no lookup reported (lab/sampler.py)
        self.summary = ("every rank reads shards in sequence through a local cache in front of an "
                        "object store with %.0f ms latency; the target rank's cache holds only one "
                        "shard in %d and cannot fill" % (latency * 1000, cached_every))

    def prepare(self, run):
        url = start_objstore(run, latency=self.latency)
        for rank, plan in enumerate(run.plans):
            src = plan["source"]
            cache = os.path.join(run.workdir, "cache-%d" % rank)
            os.makedirs(cache)
            for i in range(src["shards"]):
                if rank != run.target or i % self.cached_every == 0:
                    name = sources.shard_name(i)
                    shutil.copyfile(os.path.join(src["dir"], name), os.path.join(cache, name))
            plan["source"] = {"kind": "cached", "cache_dir": cache, "remote_url": url, "run": self.RUN,
                              "shards": src["shards"], "read_bytes": src["read_bytes"], "fill": False,
                              "timed": self.timed}


class LocalCache(Fault):
    """The target rank looks every shard up in a local cache directory that holds one
    shard in ``cached_every`` and cannot fill (a cache volume sized below the working
    set); a miss reads the rank's shard source, whatever an earlier fault made it (a FUSE
    mount with Combined). Hits and misses reach the agent as cache lookups."""

    def __init__(self, cached_every=4):
        self.cached_every = cached_every
        self.summary = ("the target rank's local cache holds one shard in %d; misses read its "
                        "shard source" % cached_every)

    def prepare(self, run):
        plan = run.plans[run.target]
        src = plan["source"]
        cache = os.path.join(run.workdir, "cache-%d" % run.target)
        os.makedirs(cache)
        for i in range(0, src["shards"], self.cached_every):
            name = sources.shard_name(i)
            shutil.copyfile(os.path.join(run.shard_dir, name), os.path.join(cache, name))
        plan["source"] = {"kind": "cached", "cache_dir": cache, "remote_dir": src["dir"],
                          "remote_pattern": src.get("pattern", sources.SHARD_PATTERN),
                          "shards": src["shards"], "read_bytes": src["read_bytes"], "fill": False}


def http_up(url):
    try:
        servers.http_get(url + "/", 1)
    except Exception as e:  # 404 means it answers
        return "404" in str(e)
    return True
