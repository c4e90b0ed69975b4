"""Everything a lab run creates is undone, in reverse order, whatever ends the run.

``Teardown`` is a stack of undo actions. Inside ``with Teardown() as td`` SIGINT and
SIGTERM raise ``Interrupted`` in the main thread (so blocking waits end at once), and
the stack unwinds in ``__exit__``; while it unwinds, further signals are noted but do not
interrupt the undo actions. Child processes are started in their own session (Ctrl-C in
a terminal reaches only the runner, which stops them in order) with PR_SET_PDEATHSIG, so
they die with the runner even if it is SIGKILLed.

Processes are stopped by group: SIGTERM to the leader, a grace period, then SIGKILL to
the whole process group (DataLoader workers, a FUSE daemon's threads, ``unshare``'s
mount namespace, which the kernel frees with its last process). Cgroups are removed once
their tasks are gone (``rmdir_cgroup``).
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self):
        return 128 + self.signum


def _pdeathsig():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def session_kwargs():
    """Popen keywords for a child in its own session that dies with this process."""
    return {"start_new_session": True, "preexec_fn": _pdeathsig}


def popen(cmd, log=None, env=None, cwd=None):
    """Start ``cmd`` in its own session, dying with us, output appended to ``log``."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, **session_kwargs())
    finally:
        if log:
            out.close()


def stop_group(proc, grace=5.0, sig=signal.SIGTERM):
    """SIGTERM the leader, wait up to ``grace``, then SIGKILL its whole process group."""
    if proc is None:
        return
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(grace)
        except (subprocess.TimeoutExpired, OSError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the leader's pid is the group's id
    except OSError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    # SIGKILL is delivered when a member next runs: on a loaded machine the leader's
    # children can still show as alive for a moment after it was reaped. Wait for them.
    deadline = time.monotonic() + 5
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def group_alive(pgid):
    """PIDs still in process group ``pgid`` (reads /proc; no signals sent)."""
    alive = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(name))
    return alive


class Teardown:
    def __init__(self, log=None):
        self.actions = []  # (description, fn)
        self.log = log or (lambda msg: None)
        self.signalled = None
        self.unwinding = False
        self._old = {}

    def push(self, description, fn, *args, **kwargs):
        self.actions.append((description, lambda: fn(*args, **kwargs)))

    def _handler(self, signum, frame):
        self.signalled = self.signalled or signum
        if not self.unwinding:
            raise Interrupted(signum)

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def unwind(self):
        self.unwinding = True
        errors = []
        while self.actions:
            description, fn = self.actions.pop()
            try:
                fn()
            except Interrupted:
                pass
            except Exception as e:
                errors.append("%s: %s" % (description, e))
        for e in errors:
            print("stallscope lab: cleanup: %s" % e, file=sys.stderr)
        return errors

    def __exit__(self, exc_type, exc, tb):
        try:
            self.unwind()
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old)
        return False


def rmdir_cgroup(path):
    """Remove a cgroup directory the run made (v1 or v2). A cgroup can be removed once its
    last task has exited, and the kernel may take a moment after the task was reaped:
    tasks still in it are moved to the parent, and the rmdir is retried for 5 s."""
    tasks = os.path.join(path, "cgroup.procs")
    parent = os.path.join(os.path.dirname(path), "cgroup.procs")
    for _ in range(100):
        try:
            with open(tasks) as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    with open(parent, "w") as f:
                        f.write(pid)
                except OSError:
                    pass
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(path)


def wait_for(pred, timeout, interval=0.2):
    """Poll ``pred`` until it is true or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
