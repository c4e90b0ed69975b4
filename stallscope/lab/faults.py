"""Fault injectors: each breaks one rank's input pipeline the way production breaks it.

A fault checks what it needs (``missing()``: one line, or None), creates what it needs
before the ranks start (``prepare``), may wrap the target rank's command (``command``),
and may act while the job runs (``tick``). Every resource is registered with the run's
Teardown *before* it is created, so an interrupt between the two still undoes it.

- CpuQuota      the target's loader workers join a cgroup with a tight CFS quota
- SlowFuse      the target reads its shards through FUSE with injected latency
- DeadFuse      ... and the FUSE daemon is SIGKILLed mid-run (reads fail with ENOTCONN)
- TinyShm       the target runs in its own mount namespace with a tiny /dev/shm
- CheckpointBurst  fsync'd bursts of writes hit the disk the target reads with O_DIRECT
- ColdCache     the target's cache tier is cold; misses go to a slow HTTP object store
"""
import os
import shutil
import signal
import sys
import time

from . import needs, procs, sources, teardown


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

    def command(self, rank, cmd):
        return cmd

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
        run.td.push("remove cgroup %s" % path, remove_cgroup, path, base)
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


def remove_cgroup(path, parent):
    """Move any process left to the parent, then remove the cgroup (rmdir can fail with
    EBUSY while the last tasks exit: retry briefly)."""
    if not os.path.isdir(path):
        return
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                left = f.read().split()
            for pid in left:
                try:
                    _write(os.path.join(parent, "cgroup.procs"), pid)
                except OSError:
                    pass
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    os.rmdir(path)


class SlowFuse(Fault):
    needs = ("root", "fuse")

    def __init__(self, latency=0.02):
        self.latency = latency
        self.fs = None
        self.summary = "the target rank reads its shards through a FUSE mount that adds %.0f ms per operation" % (
            latency * 1000)

    def prepare(self, run):
        from .slowfs import SlowFS

        mnt = os.path.join(run.workdir, "fuse-shards")
        src = run.plans[run.target]["source"]
        self.fs = SlowFS(mnt, latency=self.latency, files=src["shards"], size=src["shard_bytes"],
                         fsname="lab-objectstore")
        run.td.push("unmount %s" % mnt, self.fs.stop)
        run.created("mount", mnt)
        self.fs.start()
        run.created("pid", self.fs.proc.pid)
        src.update(dir=mnt, pattern="file%03d", direct=False)


class DeadFuse(SlowFuse):
    def __init__(self, latency=0.002, kill_at=0.35):
        super().__init__(latency)
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

    def __init__(self, size_mib=16, leftover_mib=12, sample_kib=192):
        self.size_mib, self.leftover_mib, self.sample_kib = size_mib, leftover_mib, sample_kib
        self.summary = ("the target rank runs in its own mount namespace with a %d MiB /dev/shm, "
                        "%d MiB of it held by leftovers of an earlier crash" % (size_mib, leftover_mib))

    def prepare(self, run):
        # Batches of 8 x 192 KiB = 1.5 MiB: two fit in the 4 MiB left, the loop holds
        # one while the next is made, so at most one is in flight instead of
        # workers x prefetch_factor = 4. Out-of-order delivery (in_order=False) keeps a
        # later batch holding the last slot from deadlocking the pipeline.
        plan = run.plans[run.target]
        plan.update(sample_bytes=self.sample_kib * 1024, shm_retry_s=0.2, in_order=False)

    def command(self, rank, cmd):
        # unshare(1) execs the shell in a new mount namespace (private propagation), which
        # mounts the tiny tmpfs and execs the rank: the namespace, and the tmpfs with it,
        # go away with the rank's last process. Nothing changes on the host's /dev/shm.
        script = ("mount -t tmpfs -o size=%dm,mode=1777 lab-shm /dev/shm && "
                  "head -c %d /dev/zero > /dev/shm/torch_leftover_of_crashed_run && exec \"$@\"") % (
            self.size_mib, self.leftover_mib << 20)
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"] + cmd


class CheckpointBurst(Fault):
    needs = ("disk",)

    def __init__(self, mib=256, every=4.0, read_kib=1024):
        self.mib, self.every, self.read_kib = mib, every, read_kib
        self.summary = ("%d MiB fsync'd checkpoint every %gs on the disk the target rank reads its "
                        "shards from (O_DIRECT)" % (mib, every))

    def prepare(self, run):
        src = run.plans[run.target]["source"]
        src.update(direct=True, read_bytes=self.read_kib * 1024)
        ckpt = os.path.join(run.shard_dir, "checkpoints")
        proc = run.spawn("checkpointer", [sys.executable, "-m", "stallscope.lab.checkpointer", ckpt,
                                          "--mib", str(self.mib), "--every", str(self.every)])
        run.td.push("remove %s" % ckpt, shutil.rmtree, ckpt, ignore_errors=True)
        return proc


class ColdCache(Fault):
    def __init__(self, latency=0.03):
        self.latency = latency
        self.summary = ("every rank reads through a local cache in front of an object store with %.0f ms "
                        "latency; the target rank's cache is cold and cannot fill" % (latency * 1000))

    def prepare(self, run):
        port = procs.free_port()
        run.spawn("objstore", [sys.executable, "-m", "stallscope.lab.objstore", run.shard_dir, str(port),
                               "--latency", str(self.latency)])
        url = "http://127.0.0.1:%d" % port
        teardown.wait_for(lambda: _http_up(url), 15)
        for rank, plan in enumerate(run.plans):
            src = plan["source"]
            cache = os.path.join(run.workdir, "cache-%d" % rank)
            os.makedirs(cache)
            if rank != run.target:  # warm: the shards this rank reads are in its cache
                for i in range(src["shards"]):
                    name = sources.shard_name(i)
                    shutil.copyfile(os.path.join(src["dir"], name), os.path.join(cache, name))
            plan["source"] = {"kind": "cached", "cache_dir": cache, "remote_url": url,
                              "shards": src["shards"], "read_bytes": src["read_bytes"], "fill": False}


def _http_up(url):
    try:
        procs.http_get(url + "/", 1)
    except Exception as e:  # 404 means it answers
        return "404" in str(e)
    return True
