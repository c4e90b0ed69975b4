"""One training job of the lab: N ranks of lab/trainer.py, each a pod, with a scenario's
fault on the last rank (the target).

Every job starts from the same healthy base: ranks in lockstep through a gloo
all_reduce per step, each with a 2-worker DataLoader reading 8 samples per batch from
local shard files, 150 ms of simulated GPU compute per step. Per worker that is ~20 ms a
batch, so the loader keeps far ahead; a prefetched batch still costs ~1.5 ms of IPC on
this 2-core machine, about 1% of a step, under the 2% alert line.

The base shares tensors by the ``file_system`` strategy, not torch's default
``file_descriptor``: under the default the training process takes each tensor over a
resource-sharer connection to the worker (an HMAC handshake, several round trips, each
waiting for the worker's sharer thread to get a CPU), so the handoff follows the
machine's load: with one core's worth of outside load here the base's healthy ranks
waited 2.5-3.5 % of their steps (file_system: 1.6-1.9 %), and a CI run measured 2.76 % on
a healthy rank. A scenario whose mechanism is the default's handoff or its shm allocation
(transfer-cost, the /dev/shm faults) sets ``file_descriptor`` for its target. A scenario changes
the plan of every rank (``everyone``) or of the target (``target``); its fault prepares
what it needs (cgroups, mounts, helper processes) and may change the target's plan.
"""
import json
import os
import signal
import sys
import time

from ..processes import children, servers
from . import faults, findings, pods

BASE = {
    "workers": 2, "batch_size": 8, "prefetch_factor": 2, "compute_s": 0.15,
    "sample_sleep_s": 0.002, "sample_cpu_s": 0.0, "sample_bytes": 4096,
    "sharing_strategy": "file_system",  # see above: a handoff floor that ignores the machine's load
    # the ranks drive a (simulated) GPU: a healthy set-up pins (issue 32's set-up checks);
    # without an accelerator torch warns once and does not pin, so nothing else changes
    "pin_memory": True,
}
SHARDS = {"kind": "files", "shards": 8, "read_bytes": 65536, "shard_bytes": 4 << 20}
READY_TIMEOUT_S = 120.0  # torch import + gloo rendezvous on a loaded 2-core machine


class Unavailable(Exception):
    """The scenario needs what this machine lacks (exit 2)."""


class Job:
    """Attributes a fault and the findings use: ``td``, ``say``, ``workdir`` (the job's
    own), ``shard_dir``, ``plans``, ``target``, ``world``, ``job`` (its name),
    ``duration``, ``agent``, ``prom``, ``scenario``, ``fault``; ``spawn``, ``created``,
    ``log_tail``, ``pod``."""

    def __init__(self, session, scenario, world, name=None, pod_prefix="trainer-", duration=None,
                 placement=None):
        self.session, self.scenario, self.world = session, scenario, world
        # the lab node (lab/nodes.py) of each rank; None: every rank beside the one agent
        self.placement = list(placement) if placement else None
        if self.placement is not None and len(self.placement) != world:
            raise ValueError("placement names %d nodes for %d ranks" % (len(self.placement), world))
        self.td, self.say = session.td, session.say
        self.job = name or "lab-" + scenario.name
        self.pod_prefix = pod_prefix
        self.target = world - 1
        self.duration = float(duration or scenario.real.duration)
        # the trailing window the findings judge the ranks on: the duration, or wider where
        # the run was too slow for a verdict in it (runner.verdict_seconds)
        self.judged_s = self.duration
        self.fault = scenario.make_fault()
        self.workdir = os.path.join(session.workdir, self.job)
        self.shard_dir = session.shard_dir
        self.plans = []
        self.procs = []

    prom = property(lambda self: self.session.prom)

    @property
    def agent(self):
        """The target rank's agent (its node's, on lab nodes)."""
        return self.node(self.target).agent if self.placement else self.session.agent

    def node(self, rank):
        return self.placement[rank] if self.placement else None

    def agent_of(self, rank):
        """The agent rank ``rank`` reports to (its node's)."""
        return self.node(rank).agent if self.placement else self.session.agent

    def agents(self):
        """The job's agents, one a node it runs on, the target's first."""
        found = {}
        for rank in [self.target] + list(range(self.world)):
            found.setdefault(id(self.agent_of(rank)), self.agent_of(rank))
        return list(found.values())

    def created(self, kind, value):
        self.session.created(kind, value)

    def spawn(self, name, cmd, env=None):
        p = self.session.popen("%s of %s" % (name, self.job), os.path.join(self.workdir, name + ".log"),
                               cmd, env)
        self.procs.append((name, p))
        return p

    def log_tail(self, name, n=15):
        try:
            with open(os.path.join(self.workdir, name + ".log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def pod(self, rank):
        return "%s%d" % (self.pod_prefix, rank)

    # -- start ---------------------------------------------------------------------------
    def start(self):
        """Plans, the fault's preparation, the ranks. Raises Unavailable first when the
        machine lacks what the fault needs."""
        reason = self.fault.missing()
        if reason:
            raise Unavailable("%s %s" % (self.scenario.name, reason))
        os.makedirs(self.workdir, exist_ok=True)
        self.make_plans()
        self.fault.prepare(self)
        self.say("lab: %s: %s" % (self.job, self.fault_line()))
        for rank, plan in enumerate(self.plans):
            path = os.path.join(self.workdir, "rank%d.json" % rank)
            with open(path, "w") as f:
                json.dump(plan, f, indent=1)
            node = self.node(rank)
            cmd = pods.wrap([sys.executable, "-m", "stallscope.lab.trainer", path],
                            self.fault if rank == self.target else None,
                            pods.make_cgroup(self, rank, node.cgroup if node else None),
                            node=node.enter() if node else ())
            self.spawn("rank%d" % rank, cmd, env=self.rank_env(rank))
        return self

    def make_plans(self):
        # gloo's rendezvous on rank 0's node (across the lab's bridge from the others)
        master = "%s:%d" % (self.node(0).ip if self.placement else "127.0.0.1", servers.free_port())
        real = self.scenario.real
        for rank in range(self.world):
            plan = dict(BASE, rank=rank, world_size=self.world, master=master,
                        max_s=self.duration + READY_TIMEOUT_S + 600,
                        source=dict(SHARDS, dir=self.shard_dir))
            plan.update(real.everyone)
            if rank == self.target:
                plan.update(real.target)
            self.plans.append(plan)

    def rank_env(self, rank):
        node = self.node(rank)
        env = {"STALLSCOPE_SOCKET": (node.agent if node else self.agent).socket, "STALLSCOPE_JOB": self.job,
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(self.world),
               "POD_NAME": self.pod(rank), "POD_NAMESPACE": findings.NAMESPACE,
               "OMP_NUM_THREADS": "1"}
        if node is not None and node.isolated:
            env["GLOO_SOCKET_IFNAME"] = "eth0"  # the node's veth; its hostname resolves nowhere
        return env

    def fault_line(self):
        real = self.scenario.real
        if not isinstance(self.fault, faults.NoFault):
            return "fault on rank %d: %s" % (self.target, self.fault.summary)
        if real.target:  # the fault is in the target's plan (slower samples, fewer workers)
            return "fault on rank %d: %s" % (self.target, _changes(real.target))
        return "no fault injected" + (" (every rank: %s)" % _changes(real.everyone) if real.everyone else "")

    # -- while it runs -------------------------------------------------------------------
    def check_alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise RuntimeError("%s of %s exited with %s:\n%s" % (
                    name, self.job, p.returncode, self.log_tail(name)))

    def ranks(self):
        """The job's ranks as their agents see them (every node's, on lab nodes)."""
        found = {}
        for agent in self.agents():
            body = agent.api("/api/v1/ranks?job=" + self.job)
            found.update((r["rank"], dict(r, node=r.get("node") or body.get("node"))) for r in body["ranks"])
        return found

    def wait_ready(self, batches=1):
        """Until every rank has reported ``batches`` batches; returns the ranks' counters then."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            ranks = self.ranks()
            if len(ranks) == self.world and all(r["batches"] >= max(1, batches) for r in ranks.values()):
                return ranks
            time.sleep(0.5)
        raise RuntimeError("the ranks of %s did not start within %.0fs" % (self.job, READY_TIMEOUT_S))

    def kill_rank(self, rank):
        """SIGKILL rank ``rank`` and its loader workers (its process group), as an OOM
        kill or a node problem ends a rank without warning."""
        name = "rank%d" % rank
        p = dict(self.procs)[name]
        children.stop_group(p, grace=0, sig=signal.SIGKILL)
        self.procs = [(n, q) for n, q in self.procs if n != name]


def _changes(plan):
    return ", ".join("%s=%s" % kv for kv in sorted(plan.items()))
