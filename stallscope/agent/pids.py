"""PIDs across PID namespaces, read from procfs (``--path.procfs``; /host/proc in a pod).

A trainer in a pod reports its loader workers' PIDs as its own PID namespace numbers
them. The agent (hostPID) knows the trainer's host PID from SO_PEERCRED and maps the
workers through the NSpid line of /proc/<pid>/status, whose last field is the PID in the
innermost namespace (proc(5)).
"""
import os


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def start_time(procfs, pid):
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), or None."""
    stat = _read(os.path.join(procfs, str(pid), "stat"))
    if not stat:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = stat[stat.rfind(")") + 2:].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def alive(procfs, pid, start=None):
    now = start_time(procfs, pid)
    if now is None:
        return False
    return start is None or now == start


def ns_pid(procfs, pid):
    status = _read(os.path.join(procfs, str(pid), "status")) or ""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else None
    return None


def children(procfs, pid):
    out = []
    task_dir = os.path.join(procfs, str(pid), "task")
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return out
    for tid in tids:
        text = _read(os.path.join(task_dir, tid, "children")) or ""
        out.extend(int(c) for c in text.split())
    return out


def translate(procfs, host_pid, reported_pid, worker_pids):
    """Worker PIDs as the trainer reported them → PIDs in the agent's namespace."""
    if not worker_pids:
        return []
    if host_pid is None or host_pid == reported_pid:
        return list(worker_pids)
    wanted = set(worker_pids)
    found = {}
    for child in children(procfs, host_pid):
        inner = ns_pid(procfs, child)
        if inner in wanted:
            found[inner] = child
    # Workers not found among the children (forkserver/spawn start methods) keep their
    # reported PID: the workers' own reports (role=worker) carry their real PID.
    return [found.get(p, p) for p in worker_pids]
