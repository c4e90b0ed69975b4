"""A real stallscope setup on one machine: an agent, a Prometheus scraping it with rule
files loaded, and instrumented training processes (``toytrain``), some of them in
cgroups made for the occasion. Everything it creates is removed by ``close()``, also
after a failure (use it as a context manager).

Grows with the signals: a rank's loader workers in a v1 ``cpu`` cgroup with a CFS quota
(throttling), a rank in a cgroup2 child (per-pod PSI). Where the machine lacks root or
a writable cgroup, ``cpu_quota_cgroup`` / ``pressure_cgroup`` return None and say why
in ``missing``.
"""
import os
import signal
import subprocess
import sys
import time
import uuid

from .procs import AgentProcess, PrometheusProcess

CPU_V1 = ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct")
UNIFIED = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class Rig:
    def __init__(self, workdir, agent_args=(), agent_env=None):
        self.dir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.agent_args = list(agent_args)
        self.agent_env = agent_env
        self.agent = None
        self.prometheus = None
        self.trainers = {}   # name -> Popen
        self.cgroups = []    # directories to remove, innermost first at close
        self.missing = {}    # what could not be set up -> why
        self.mounts = []     # SlowFS instances
        self._fusectl = False
        self._logs = []

    # -- processes ---------------------------------------------------------------------
    def start_agent(self):
        self.agent = AgentProcess(args=self.agent_args, workdir=os.path.join(self.dir, "agent"),
                                  env=self.agent_env)
        os.makedirs(self.agent.dir, exist_ok=True)
        return self.agent.start()

    def start_prometheus(self, rule_files=(), interval="1s"):
        d = os.path.join(self.dir, "prometheus")
        os.makedirs(d, exist_ok=True)
        self.prometheus = PrometheusProcess([self.agent.url], rule_files=rule_files,
                                            interval=interval, workdir=d)
        return self.prometheus.start()

    def trainer(self, name, job, rank, namespace="stallscope-test", node=None, pod=None, mount=None,
                **opts):
        """Start ``python -m stallscope.lab.toytrain``; ``opts`` are its flags
        (sample_sleep=0.05 -> --sample-sleep 0.05; lists repeat the flag). With ``mount``
        (from fuse_mount) it runs in that mount's namespace."""
        cmd = [sys.executable, "-m", "stallscope.lab.toytrain", "--job", job, "--rank", str(rank),
               "--pod", pod or name, "--namespace", namespace, "--node", node or "rig-node"]
        for key, value in sorted(opts.items()):
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if v is not None:
                    cmd += ["--" + key.replace("_", "-"), str(v)]
        env = dict(os.environ, STALLSCOPE_SOCKET=self.agent.socket,
                   PYTHONPATH=os.pathsep.join(filter(None, [_root(), os.environ.get("PYTHONPATH")])))
        log = open(os.path.join(self.dir, "%s.log" % name), "ab")
        self._logs.append(log)
        start = mount.popen if mount is not None else subprocess.Popen
        self.trainers[name] = start(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self.trainers[name]

    def kill_trainer(self, name, sig=signal.SIGKILL):
        p = self.trainers[name]
        workers = _children_of(p.pid)
        if p.poll() is None:
            p.send_signal(sig)
        p.wait(10)
        # SIGKILL orphans the loader workers; they would exit once they notice their
        # parent is gone, but end them now so nothing outlives the test.
        _kill_all(workers)

    # -- cgroups -----------------------------------------------------------------------
    def cpu_quota_cgroup(self, cores, period_us=100_000):
        """A v1 cpu cgroup limited to ``cores`` (for --worker-cgroup), or None."""
        base = next((b for b in CPU_V1 if os.path.exists(os.path.join(b, "cpu.cfs_quota_us"))), None)
        if base is None or not os.access(base, os.W_OK):
            self.missing["cpu_quota"] = "needs root and the cgroup v1 cpu controller"
            return None
        path = self._mkdir(base)
        _write(os.path.join(path, "cpu.cfs_period_us"), str(period_us))
        _write(os.path.join(path, "cpu.cfs_quota_us"), str(int(cores * period_us)))
        return path

    def pressure_cgroup(self):
        """A cgroup2 child with *.pressure files (for --cgroup), or None."""
        base = next((b for b in UNIFIED if os.path.exists(os.path.join(b, "cgroup.procs"))
                     and os.path.exists(os.path.join(b, "cgroup.controllers"))), None)
        if base is None or not os.access(base, os.W_OK):
            self.missing["pressure"] = "needs root and a cgroup2 hierarchy"
            return None
        path = self._mkdir(base)
        if not os.path.exists(os.path.join(path, "io.pressure")):
            self.missing["pressure"] = "the kernel has no PSI for cgroups (CONFIG_PSI)"
            return None
        return path

    # -- FUSE --------------------------------------------------------------------------
    def fuse_mount(self, name, latency=0.0, **kw):
        """A slowfs FUSE mount (lab/slowfs.py) in a mount namespace of its own, as a pod's
        mounts are: pass it as ``mount=`` to ``trainer`` to run a rank that sees it at
        ``.mountpoint`` (other agents on the machine never probe it). None without root,
        /dev/fuse or fusermount3. fusectl is mounted when missing (the `waiting` count)."""
        import shutil

        if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
            self.missing["fuse"] = "needs root, /dev/fuse and fuse3 (apt-get install fuse3 libfuse2)"
            return None
        from . import slowfs

        if not self.mounts:
            self._fusectl = slowfs.ensure_fusectl()
        fs = slowfs.SlowFS(os.path.join(self.dir, name), latency=latency, private=True, **kw)
        self.mounts.append(fs)
        return fs.start()

    def _mkdir(self, base):
        path = os.path.join(base, "stallscope-rig-" + uuid.uuid4().hex[:8])
        os.mkdir(path)
        self.cgroups.append(path)
        return path

    # -- teardown ------------------------------------------------------------------------
    def close(self):
        workers = {name: _children_of(p.pid) for name, p in self.trainers.items()}
        for p in self.trainers.values():
            if p.poll() is None:
                p.terminate()
        for name, p in self.trainers.items():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            _kill_all(workers[name])
        for log in self._logs:
            log.close()
        for fs in self.mounts:
            fs.stop()
        if self._fusectl:
            subprocess.run(["umount", "/sys/fs/fuse/connections"], check=False)
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.agent is not None:
            self.agent.stop()
        for path in reversed(self.cgroups):
            rmdir_cgroup(path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _children_of(ppid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == ppid:
                out.append(int(entry))
    return out


def _kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def rmdir_cgroup(path):
    # A cgroup can be removed once its last process has exited; the kernel may take a
    # moment after the process was reaped. Move stragglers out to the parent first.
    procs = os.path.join(path, "cgroup.procs")
    parent = os.path.join(os.path.dirname(path), "cgroup.procs")
    for _ in range(100):
        try:
            for pid in open(procs).read().split():
                try:
                    _write(parent, pid)
                except OSError:
                    pass
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(path)
