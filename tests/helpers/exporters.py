"""Helpers for the exporter tests: a real rank table holding ranks for real PIDs, a host
over real (or fixture) roots whose rank list a test may fix, and lookups in collected
families."""
import contextlib
import os
import subprocess
import sys
import uuid

from stallscope.agent.host import AgentHost
from stallscope.agent.table import samples as samples_mod
from stallscope.agent.table import state
from stallscope.host.report import HookReport
from stallscope.processes.teardown import rmdir_cgroup


def rank_message(pid, worker_pids=(), rank=0, job="job1", pod="pod1", namespace="ns1", node="n1",
                 worker_exits=()):
    """A trainer's report as the agent's validation makes it (HookReport)."""
    return HookReport.of({"id": {"job": job, "rank": rank, "local_rank": rank, "world_size": 8, "pod": pod,
                   "namespace": namespace, "node": node},
            "pid": pid, "role": "main", "mono_ns": 0, "wall_ns": 0, "dropped_total": 0,
            "events": [], "raw": {},
            "loader": {"num_workers": len(worker_pids), "prefetch_factor": 2, "batch_size": 4,
                       "pin_memory": False, "persistent_workers": False,
                       "worker_pids": list(worker_pids), "worker_exits": list(worker_exits)}})


def table_with(*ranks, procfs="/proc"):
    """ranks: dicts of rank_message kwargs. Returns a real RankTable."""
    table = state.RankTable(procfs_root=procfs, node="n1")
    for r in ranks:
        table.apply(rank_message(**r))
    return table


class FixedHost(AgentHost):
    """The agent's host over ``table``, whose rank list a test may fix (``rank_list``)."""

    def __init__(self, table=None, **paths):
        super().__init__(table or state.RankTable(node="n1"), samples_mod.SampleStore(60), **paths)
        self.rank_list = None

    def ranks(self):
        return self.table.snapshot() if self.rank_list is None else list(self.rank_list)


def context(table=None, **paths):
    return FixedHost(table, **paths)


def collect(exporter, ranks=None):
    """One collection of ``exporter`` over ``ranks`` (default: its host's table)."""
    exporter.host.rank_list = ranks
    return list(exporter.collect())


def samples_of(families):
    """{(metric sample name, frozenset(labels.items())): value} over families."""
    out = {}
    for fam in families:
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def values(families, name, **labels):
    """Values of samples called ``name`` whose labels include ``labels``."""
    return [v for (n, ls), v in samples_of(families).items()
            if n == name and set(labels.items()) <= ls]


def spawn(code, **kw):
    """A Python child running ``code`` (killed by the caller)."""
    return subprocess.Popen([sys.executable, "-c", code], **kw)


def kill(proc):
    if proc is not None and proc.poll() is None:
        proc.kill()
    if proc is not None:
        proc.wait()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def scratch_cgroup(base):
    """A fresh cgroup under ``base`` (v1 controller dir or cgroup2), and a list to put
    the processes in it; they are killed and the cgroup removed on exit."""
    path = os.path.join(base, "stallscope-test-" + uuid.uuid4().hex[:8])
    os.mkdir(path)
    procs = []
    try:
        yield path, procs
    finally:
        for p in procs:
            kill(p)
        rmdir_cgroup(path)


def join_cgroup(path, proc):
    write(os.path.join(path, "cgroup.procs"), str(proc.pid))


def scraped(text, name, **labels):
    """Values of samples called ``name`` with ``labels`` in a /metrics body."""
    from prometheus_client.parser import text_string_to_metric_families

    return [s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name and set(labels.items()) <= set(s.labels.items())]
