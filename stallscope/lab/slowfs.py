"""slowfs: a read-only FUSE filesystem with injected latency, for stall scenarios and
tests (mfusepy over libfuse). Every operation that would reach a storage backend
(lookup, open, read, statfs) sleeps ``--latency`` seconds first, as a slow object store
behind Mountpoint for S3 or gcsfuse would; with ``--slow-every P --slow-for D
--slow-latency L``, L seconds instead during the first D seconds of every P since the
daemon started (brownouts of the backend); with ``--contention L BPS``, up to L seconds more
while the node's disks write (L at BPS bytes/s and over, in proportion below): a backend
on the device the node's checkpoints go to, whose reads queue behind their writes.

``python -m stallscope.lab.slowfs MOUNTPOINT [--latency S] [--files N] [--size BYTES]``
serves in the foreground. ``SlowFS`` runs it as a child process and breaks it the ways
real daemons break: ``kill(SIGKILL)`` (every call then fails with ENOTCONN) and
``kill(SIGSTOP)`` (calls hang). ``stop()`` always recovers: SIGCONT, abort the
connection through fusectl when it is mounted, lazy unmount, reap the daemon.

``SlowFS(..., private=True)`` mounts it in a mount namespace of its own (as a pod's
mounts are): only processes started with ``enter(cmd)`` see it, so other agents on the
machine do not probe it; this process reaches it at ``path``.
"""
import argparse
import errno
import os
import signal
import stat
import subprocess
import sys
import time


def _ops_class():
    import mfusepy

    class SlowOps(mfusepy.Operations):
        use_ns = True

        def __init__(self, files, size, latency, tail_every=0, tail_latency=0.0, brownouts=None,
                     contention=None):
            self.contention = contention  # (latency at full load, bytes/s of writes that is full)
            self.disk = DiskWrites() if contention else None
            self.names = {"/file%03d" % i for i in range(files)}
            self.size = size
            self.latency = latency
            self.brownouts = brownouts  # (every, for, latency) seconds, or None
            self.t0 = time.monotonic()
            self.tail_every, self.tail_latency = tail_every, tail_latency
            self.reads = 0
            self.t = time.time_ns()

        def _wait(self):
            latency = self.latency
            if self.brownouts:
                every, length, slow = self.brownouts
                if (time.monotonic() - self.t0) % every < length:
                    latency = slow
            if self.contention:
                slow, full = self.contention
                latency += slow * min(1.0, self.disk.rate() / full)
            if latency:
                time.sleep(latency)

        def getattr(self, path, fh=None):
            base = {"st_uid": 0, "st_gid": 0, "st_atime": self.t, "st_mtime": self.t,
                    "st_ctime": self.t}
            if path == "/":
                return dict(base, st_mode=stat.S_IFDIR | 0o755, st_nlink=2)
            self._wait()
            if path not in self.names:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return dict(base, st_mode=stat.S_IFREG | 0o444, st_nlink=1, st_size=self.size)

        def readdir(self, path, fh):
            return [".", ".."] + sorted(n[1:] for n in self.names)

        def open(self, path, flags):
            self._wait()
            return 0

        def read(self, path, size, offset, fh):
            self.reads += 1  # under the GIL; an off-by-one across threads is harmless
            if self.tail_every and self.reads % self.tail_every == 0:
                time.sleep(self.tail_latency)  # an object store's tail: a few reads very slow
            else:
                self._wait()
            return b"s" * max(0, min(size, self.size - offset))

        def statfs(self, path):
            self._wait()
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1024, "f_bfree": 512,
                    "f_bavail": 512, "f_files": 100, "f_ffree": 50, "f_namemax": 255}

    return SlowOps


class DiskWrites:
    """The node's disks' write rate (bytes/s) from /proc/diskstats (the kernel's
    Documentation/admin-guide/iostats.rst: field 10, sectors written, in 512-byte units),
    over whole disks (/sys/block, no loop or ram devices), read at most every 0.2 s: a
    backend that shares a device with the node's writers slows with them (--contention)."""

    EVERY_S = 0.2

    def __init__(self, path="/proc/diskstats"):
        self.path = path
        self.disks = {d for d in os.listdir("/sys/block") if not d.startswith(("loop", "ram", "zram"))}
        self.last = None  # (t, sectors)
        self.value = 0.0

    def rate(self):
        now = time.monotonic()
        if self.last is not None and now - self.last[0] < self.EVERY_S:
            return self.value
        sectors = 0
        with open(self.path) as f:
            for line in f:
                parts = line.split()
                if len(parts) > 9 and parts[2] in self.disks:
                    sectors += int(parts[9])
        if self.last is not None:
            self.value = (sectors - self.last[1]) * 512 / (now - self.last[0])
        self.last = (now, sectors)
        return self.value


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.slowfs", description=__doc__.split("\n\n")[0])
    p.add_argument("mountpoint")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to each backend operation")
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--size", type=int, default=1 << 20, help="bytes per file")
    p.add_argument("--fsname", default="slowfs", help="the mount's source (how drivers are named)")
    p.add_argument("--subtype", default=None, help="fstype becomes fuse.SUBTYPE")
    p.add_argument("--tail-every", type=int, default=0, metavar="N",
                   help="every Nth read takes --tail-latency instead (0: never)")
    p.add_argument("--tail-latency", type=float, default=0.0, metavar="S")
    p.add_argument("--slow-every", type=float, default=0.0, metavar="P",
                   help="a brownout starts every P seconds (0: never)")
    p.add_argument("--slow-for", type=float, default=0.0, metavar="D", help="... and lasts D seconds")
    p.add_argument("--slow-latency", type=float, default=0.0, metavar="L",
                   help="... with L seconds added to each backend operation")
    p.add_argument("--contention", type=float, nargs=2, default=None, metavar=("L", "BPS"),
                   help="a backend on a device the node writes to: L seconds more per operation "
                        "while the node's disks write BPS bytes/s or more (in proportion below)")
    a = p.parse_args(argv)
    brownouts = (a.slow_every, a.slow_for, a.slow_latency) if a.slow_every else None
    import mfusepy

    kw = {"fsname": a.fsname}
    if a.subtype:
        kw["subtype"] = a.subtype
    mfusepy.FUSE(_ops_class()(a.files, a.size, a.latency, a.tail_every, a.tail_latency, brownouts,
                              tuple(a.contention) if a.contention else None),
                 a.mountpoint,
                 foreground=True,
                 nothreads=False, allow_other=True, **kw)


def fuse_mount(mountpoint, mountinfo="/proc/self/mountinfo"):
    """The mountinfo entry of the FUSE mount at ``mountpoint``, read without touching it."""
    from ..system.procfs import parse_mountinfo

    try:
        with open(mountinfo) as f:
            text = f.read()
    except OSError:
        return None
    found = [m for m in parse_mountinfo(text) if m.mountpoint == mountpoint and m.fstype.startswith("fuse")]
    return found[-1] if found else None


FUSECTL = "/sys/fs/fuse/connections"


class SlowFS:
    def __init__(self, mountpoint, latency=0.0, files=8, size=1 << 20, fsname="slowfs", subtype=None,
                 private=False, tail_every=0, tail_latency=0.0, brownouts=None, popen_kwargs=None,
                 contention=None, prefix=()):
        self.mountpoint = os.path.abspath(mountpoint)
        self.args = ["--latency", str(latency), "--files", str(files), "--size", str(size),
                     "--fsname", fsname] + (["--subtype", subtype] if subtype else [])
        if tail_every:
            self.args += ["--tail-every", str(tail_every), "--tail-latency", str(tail_latency)]
        if brownouts:
            self.args += ["--slow-every", str(brownouts[0]), "--slow-for", str(brownouts[1]),
                          "--slow-latency", str(brownouts[2])]
        if contention:
            self.args += ["--contention", str(contention[0]), str(contention[1])]
        self.private = private
        self.prefix = list(prefix)  # a command that enters a lab node first (lab/nodes.py)
        self.popen_kwargs = popen_kwargs or {}  # e.g. the lab's own session + death signal
        self.proc = None
        self.mount = None

    def start(self, timeout=20.0):
        os.makedirs(self.mountpoint, exist_ok=True)
        prefix = self.prefix + (["unshare", "-m", "--propagation", "private"] if self.private else [])
        self.proc = subprocess.Popen(prefix + [sys.executable, "-m", "stallscope.lab.slowfs", self.mountpoint]
                                     + self.args, stderr=subprocess.PIPE, **self.popen_kwargs)
        mountinfo = "/proc/%d/mountinfo" % self.proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.mount = fuse_mount(self.mountpoint, mountinfo)
            if self.mount is not None:
                return self
            if self.proc.poll() is not None:
                raise RuntimeError("slowfs exited: %s" % self.proc.stderr.read().decode()[-500:])
            time.sleep(0.05)
        self.stop()
        raise TimeoutError("slowfs did not mount %s in %.0fs" % (self.mountpoint, timeout))

    @property
    def path(self):
        """The mount as this process reaches it."""
        if self.private:
            return "/proc/%d/root%s" % (self.proc.pid, self.mountpoint)
        return self.mountpoint

    def enter(self, cmd):
        """``cmd`` run inside the mount's namespace (a command list for Popen)."""
        if not self.private:
            return list(cmd)
        return ["nsenter", "-t", str(self.proc.pid), "-m", "--"] + list(cmd)

    def popen(self, cmd, timeout=10.0, **kw):
        """Start ``cmd`` in the mount's namespace; return once it is in there."""
        p = subprocess.Popen(self.enter(cmd), **kw)
        if self.private:
            want = os.readlink("/proc/%d/ns/mnt" % self.proc.pid)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if os.readlink("/proc/%d/ns/mnt" % p.pid) == want:
                        break
                except OSError:
                    pass
                if p.poll() is not None or time.monotonic() > deadline:
                    p.kill()
                    p.wait()
                    raise RuntimeError("%s did not enter the mount namespace of %s" % (
                        cmd[0], self.mountpoint))
                time.sleep(0.01)
        return p

    @property
    def minor(self):
        return int(self.mount.dev.split(":")[1])

    def connection(self):
        """This mount's fusectl directory, or None when fusectl is not mounted."""
        d = os.path.join(FUSECTL, str(self.minor))
        return d if os.path.isdir(d) else None

    def kill(self, sig):
        os.kill(self.proc.pid, sig)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        if self.mount is not None:
            conn = self.connection()
            if conn is not None:
                try:
                    with open(os.path.join(conn, "abort"), "w") as f:
                        f.write("1")  # fails every pending request with ECONNABORTED
                except OSError:
                    pass
            subprocess.run(self.enter(["umount", "-l", self.mountpoint]), stderr=subprocess.DEVNULL,
                           check=False)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def ensure_fusectl():
    """Mount fusectl if it is not; returns True when this call mounted it."""
    if os.path.isdir(FUSECTL) and os.listdir(FUSECTL):
        return False
    from ..system.procfs import parse_mountinfo

    with open("/proc/self/mountinfo") as f:
        if any(m.fstype == "fusectl" for m in parse_mountinfo(f.read())):
            return False
    subprocess.run(["mount", "-t", "fusectl", "none", FUSECTL], check=True)
    return True


if __name__ == "__main__":
    main()
