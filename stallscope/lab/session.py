"""A lab session: a work directory with shard files, a stallscope agent, optionally a
Prometheus evaluating the generated alert rules, and the training jobs started in it
(lab/job.py). ``stallscope lab run`` makes one with one job; a test can start several
jobs against one agent.

Everything is registered with a Teardown before it is created, and recorded in the work
directory's manifest.json (process groups, mounts, cgroups) so that a test can check
that nothing outlives the session. Order of teardown (the reverse of creation): the
jobs' ranks and helpers, the faults' resources (mounts, cgroups), Prometheus, the agent,
the work directory.
"""
import json
import os
import shutil
import sys
import tempfile

from ..processes import children, servers
from . import findings, needs, nodes, sources
from .job import SHARDS, Job


class Session:
    def __init__(self, td, workdir=None, say=None):
        self.td = td
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.manifest = {"runner_pid": os.getpid(), "jobs": [], "pgids": [], "mounts": [], "cgroups": [],
                         "namespaces": [], "interfaces": []}
        self.agent = self.prom = None
        self.rules = []
        self.jobs = []
        self.network = None  # lab nodes (add_node), each with its own agent
        if workdir:
            self.workdir = os.path.abspath(workdir)
            os.makedirs(self.workdir, exist_ok=True)
        else:
            self.workdir = tempfile.mkdtemp(prefix="stallscope-lab-", dir=needs.disk_dir())
            td.push("remove %s" % self.workdir, shutil.rmtree, self.workdir, ignore_errors=True)
        self.shard_dir = os.path.join(self.workdir, "shards")
        sources.make_shards(self.shard_dir, SHARDS["shards"], SHARDS["shard_bytes"])

    def created(self, kind, value):
        self.manifest[kind + "s"].append(value)
        with open(os.path.join(self.workdir, "manifest.json"), "w") as f:
            json.dump(self.manifest, f, indent=1)

    def popen(self, name, log, cmd, env=None):
        """Start ``cmd`` in its own session (dying with us), stopped by the teardown."""
        p = children.popen(cmd, log=log, env=children.child_env(env))
        self.td.push("stop %s" % name, children.stop_group, p)
        self.created("pgid", p.pid)
        return p

    def _serve(self, what, server):
        """Start an AgentProcess or PrometheusProcess, stopped by the teardown."""
        os.makedirs(server.dir, exist_ok=True)
        self.td.push("stop " + what, server.stop)
        server.start()
        self.created("pgid", server.proc.pid)
        return server

    def start_agent(self, window, extra_args=()):
        """The agent with the lab's settings for a job of ``window`` seconds; ``extra_args``
        come last, so they override (e.g. a dcgm-exporter URL, a faster GPU sampler)."""
        self.agent = self._serve("the agent", servers.AgentProcess(
            args=findings.agent_args(window) + list(extra_args),
            workdir=os.path.join(self.workdir, "agent"), popen_kwargs=children.session_kwargs()))
        return self.agent

    def add_node(self, name, window=None, agent_args=None):
        """A lab node (lab/nodes.py) with its agent: ``agent_args``, or start_agent's for a
        job of ``window`` seconds. The first node's agent is also the session's ``agent``."""
        if self.network is None:
            self.network = nodes.Network(self)
        node = self.network.add(name)
        node.start_agent(findings.agent_args(window) if agent_args is None else agent_args)
        self.agent = self.agent or node.agent
        return node

    def agents(self):
        """Every agent of the session: one per lab node, or the one agent."""
        if self.network is not None:
            return [n.agent for n in self.network.nodes if n.agent is not None]
        return [self.agent] if self.agent else []

    def start_prometheus(self, rule_files=None):
        """Prometheus scraping every agent every second with ``rule_files`` (default: the
        generated rules with the lab's short windows)."""
        self.rules = list(rule_files) if rule_files is not None else findings.rule_files(
            os.path.join(self.workdir, "rules"))
        self.prom = self._serve("prometheus", servers.PrometheusProcess(
            [a.url for a in self.agents()], rule_files=self.rules, interval="1s",
            workdir=os.path.join(self.workdir, "prometheus"), popen_kwargs=children.session_kwargs()))
        return self.prom

    def start_job(self, scenario, ranks=2, **kw):
        """Start ``scenario``'s job (lab/job.py's Job keywords: name, pod_prefix, duration,
        placement: the lab node of each rank).
        A second job gets pods named after it: two pods of one name are one pod to the
        agent, which refuses a second process reporting as it (identity_mismatch)."""
        if self.jobs and "pod_prefix" not in kw and kw.get("name"):
            kw["pod_prefix"] = kw["name"] + "-"
        job = Job(self, scenario, ranks, **kw)
        self.manifest["jobs"].append(job.job)
        self.jobs.append(job)
        return job.start()

    def check_alive(self):
        for job in self.jobs:
            job.check_alive()
