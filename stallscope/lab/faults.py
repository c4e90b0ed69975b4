"""Fault injectors: each breaks one rank's input pipeline the way production breaks it.

A fault checks what it needs (``missing()``: one line, or None), creates what it needs
before the ranks start (``prepare``), may wrap the target rank's command (``command``),
and may act while the job runs (``tick``). Every resource is registered with the run's
Teardown *before* it is created, so an interrupt between the two still undoes it.

- CpuQuota      the target's loader workers join a cgroup with a tight CFS quota
- SlowFuse      the target reads its shards through FUSE with injected latency
- DeadFuse      ... and the FUSE daemon is SIGKILLed mid-run (reads fail with ENOTCONN)
- TinyShm       the target runs in its own mount namespace with a tiny /dev/shm
- CheckpointBurst  checkpoint uploads saturate the storage server the target reads from
- ColdCache     the target's cache tier is cold; misses go to a slow HTTP object store
"""
import os
import shutil
import signal
import sys

from . import needs, procs, sources, teardown
from .rig import rmdir_cgroup


class Fault:
    needs = ()
    summary = "no fault"

    def missing(self):
        for need in self.needs:
            reason = needs.check(need)
            if reason:
                return reason
        return None

    def prepare(self, run):
        pass

    def setup_lines(self):
        """Shell lines run as root in the target rank's mount namespace before it starts."""
        return []

    def enter(self):
        """A command prefix that enters an existing mount namespace for the target, or None."""
        return None

    def own_mounts(self):
        return ()

    def tick(self, run, elapsed):
        pass


class NoFault(Fault):
    pass


class CpuQuota(Fault):
    needs = ("root", "cpu_cgroup")

    def __init__(self, cpus=0.1):
        self.cpus = cpus
        self.summary = "the target rank's loader workers share a cgroup with a %.2g-CPU CFS quota" % cpus

    def prepare(self, run):
        version, base = needs.cpu_cgroup()
        path = os.path.join(base, "stallscope-lab-%d" % os.getpid())
        # rig's removal: tasks left are moved to the parent, rmdir retried while they exit
        run.td.push("remove cgroup %s" % path, rmdir_cgroup, path)
        os.mkdir(path)
        run.created("cgroup", path)
        period = 100000
        if version == 1:
            _write(os.path.join(path, "cpu.cfs_period_us"), period)
            _write(os.path.join(path, "cpu.cfs_quota_us"), int(self.cpus * period))
        else:
            _write(os.path.join(path, "cpu.max"), "%d %d" % (int(self.cpus * period), period))
        run.plans[run.target]["worker_cgroup"] = path


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


class SlowFuse(Fault):
    needs = ("root", "fuse")

    def __init__(self, latency=0.01, tail_every=100, tail_latency=1.0):
        self.latency, self.tail_every, self.tail_latency = latency, tail_every, tail_latency
        self.fs = None
        self.summary = ("the target rank reads its shards through a FUSE mount that adds %.0f ms per "
                        "operation, and %.1f s to every %dth read (an object store's tail)" % (
                            latency * 1000, tail_latency, tail_every))

    def prepare(self, run):
        from .slowfs import SlowFS

        mnt = os.path.join(run.workdir, "fuse-shards")
        src = run.plans[run.target]["source"]
        # In a mount namespace of its own (as a pod's mounts are); the target rank enters it.
        self.fs = SlowFS(mnt, latency=self.latency, files=src["shards"], size=src["shard_bytes"],
                         fsname="lab-objectstore", private=True, tail_every=self.tail_every,
                         tail_latency=self.tail_latency, popen_kwargs=teardown.session_kwargs())
        run.td.push("unmount %s" % mnt, self.fs.stop)
        run.created("mount", mnt)
        self.fs.start()
        run.created("pgid", self.fs.proc.pid)
        src.update(dir=mnt, pattern="file%03d", direct=False)

    def enter(self):
        return self.fs.enter([])

    def own_mounts(self):
        return (self.fs.mountpoint,)


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


class TinyShm(Fault):
    needs = ("root", "unshare")

    def __init__(self, size_mib=16, leftover_mib=14, sample_kib=96):
        self.size_mib, self.leftover_mib, self.sample_kib = size_mib, leftover_mib, sample_kib
        self.summary = ("the target rank runs in its own mount namespace with a %d MiB /dev/shm, "
                        "%d MiB of it held by leftovers of an earlier crash" % (size_mib, leftover_mib))

    def prepare(self, run):
        # Batches of 8 x 96 KiB = 768 KiB: two fit in the 2 MiB left (and /dev/shm
        # stays over 90% full), the loop holds one while the next is made, so at most
        # one is in flight instead of workers x prefetch_factor = 4, and a worker gets
        # its slot only on a retry (0.5 s backoff). Out-of-order delivery (in_order=False)
        # keeps a later batch that took the last slot from deadlocking the pipeline.
        plan = run.plans[run.target]
        plan.update(sample_bytes=self.sample_kib * 1024, shm_retry_s=0.5, in_order=False)

    def setup_lines(self):
        # In the target's own mount namespace: the host's /dev/shm is not touched.
        return ["mount -t tmpfs -o size=%dm,mode=1777 lab-shm /dev/shm" % self.size_mib,
                "head -c %d /dev/zero > /dev/shm/torch_leftover_of_crashed_run" % (self.leftover_mib << 20)]


def start_objstore(run, latency=0.0, bandwidth_mbps=0.0):
    """The lab's object store over the shard directory; returns its URL."""
    port = procs.free_port()
    run.spawn("objstore", [sys.executable, "-m", "stallscope.lab.objstore", run.shard_dir, str(port),
                           "--latency", str(latency), "--bandwidth", str(bandwidth_mbps)])
    url = "http://127.0.0.1:%d" % port
    if not teardown.wait_for(lambda: _http_up(url), 15):
        raise RuntimeError("the lab object store did not start:\n" + run.log_tail("objstore"))
    return url


class CheckpointBurst(Fault):
    def __init__(self, mib=512, every=6.0, bandwidth_mbps=200.0, read_kib=256, reads=4):
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

    def __init__(self, latency=0.03, cached_every=3):
        self.latency, self.cached_every = latency, cached_every
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
                              "shards": src["shards"], "read_bytes": src["read_bytes"], "fill": False}


def _http_up(url):
    try:
        procs.http_get(url + "/", 1)
    except Exception as e:  # 404 means it answers
        return "404" in str(e)
    return True
