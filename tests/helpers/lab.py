"""Helpers for the tests that run the lab: run ``stallscope lab ...`` as a real command,
open a lab session in-process (jobs of the one trainer against one agent), and find
anything a run left behind (processes, mounts in any mount namespace, cgroups)."""
import contextlib
import json
import os
import subprocess
import sys

from stallscope.lab.session import Session
from stallscope.processes import children, teardown


def diagnose_json(*args, window, prometheus=None):
    """``stallscope diagnose ARGS --window WINDOW --json`` as on-call runs it (Prometheus
    only where given): (exit code, the report)."""
    env = children.child_env({"STALLSCOPE_PROMETHEUS_URL": prometheus or ""})
    p = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", *args, "--window", window,
                        "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stderr and p.stdout, (args, p.stderr)
    return p.returncode, json.loads(p.stdout)


def lab_cmd(*args):
    return [sys.executable, "-m", "stallscope", "lab"] + [str(a) for a in args]


def run_lab(*args, timeout=240):
    """Run ``stallscope lab ARGS`` to the end; returns the CompletedProcess."""
    return subprocess.run(lab_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=children.child_env())


@contextlib.contextmanager
def lab_session(workdir):
    """A lab Session in ``workdir``, everything it started undone at the end. Unlike
    ``stallscope lab run`` it leaves signal handling to pytest (Ctrl-C still unwinds)."""
    td = teardown.Teardown()
    try:
        yield Session(td, workdir=str(workdir), say=lambda msg: print(msg, flush=True))
    finally:
        td.unwind()


def manifest(workdir):
    with open(os.path.join(workdir, "manifest.json")) as f:
        return json.load(f)


def _mountpoints_under(prefix):
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/mountinfo" % pid) as f:
                for line in f:
                    mp = line.split()[4]
                    if mp.startswith(prefix):
                        found.add((mp, line.split(" - ")[1].split()[0]))
        except (OSError, IndexError):
            continue
    return found


def _processes_mentioning(text):
    out = []
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out.append((int(pid), cmd[:200]))
    return out


def leftovers(workdir):
    """Everything of the run in ``workdir`` that still exists: [] when all is clean."""
    workdir = os.path.abspath(workdir)
    m = manifest(workdir)
    left = []
    for pgid in m["pgids"]:
        alive = children.group_alive(pgid)
        if alive:
            left.append("process group %d: %s" % (pgid, alive))
    for cg in m["cgroups"]:
        if os.path.exists(cg):
            left.append("cgroup %s" % cg)
    for ns in m.get("namespaces", ()):
        if os.path.exists(os.path.join("/run/netns", ns)):
            left.append("network namespace %s" % ns)
    for name in m.get("interfaces", ()):
        if os.path.exists(os.path.join("/sys/class/net", name)):
            left.append("interface %s" % name)
    for mp in _mountpoints_under(workdir):
        left.append("mount %s (%s)" % mp)
    for pid, cmd in _processes_mentioning(workdir):
        left.append("process %d: %s" % (pid, cmd))
    return left
