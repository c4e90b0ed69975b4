"""Child processes that cannot outlive the one that started them, stopped by group.

A child is started in its own session (a terminal's Ctrl-C reaches only the parent, which
stops its children in order) with PR_SET_PDEATHSIG (prctl(2)), so it dies with the parent
even if the parent is SIGKILLed. It is stopped by group: SIGTERM to the leader, a grace
period, then SIGKILL to the whole process group (DataLoader workers, a FUSE daemon's
threads, ``unshare``'s mount namespace, which the kernel frees with its last process).
"""
import ctypes
import os
import signal
import subprocess
import time

PR_SET_PDEATHSIG = 1

# Child processes import the same stallscope as their parent (a worktree or a checkout
# that is not the installed one).
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(extra=None):
    """This environment, with PYTHONPATH leading to this stallscope, updated by ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


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
