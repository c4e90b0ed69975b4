"""Run one scenario end to end: agent (+ Prometheus), the fault, N ranks, a measured
window with a progress display, then what stallscope found; undo everything after.

Order of teardown (the reverse of creation): ranks, the fault's resources (mounts,
cgroups, helper processes), Prometheus, the agent, the work directory.
"""
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

from . import faults, findings, needs, pods, procs, report, sources, teardown
from .scenarios import BASE, SHARDS

READY_TIMEOUT_S = 120.0  # torch import + gloo rendezvous on a loaded 2-core machine
# Alerts count from when the rules' rate window (10 s) no longer reaches back into the
# ranks' start-up (the first batch waits for the workers to start).
ALERTS_FROM_S = 11.0


class Unavailable(Exception):
    """The scenario needs what this machine lacks (exit 2)."""


@dataclasses.dataclass
class Options:
    ranks: int = 2
    duration: float = None          # None: the scenario's default
    keep: bool = False              # keep everything up after the report until Ctrl-C
    record: str = None              # directory for labelled traces
    prometheus: bool = None         # None: when installed
    workdir: str = None             # None: a temporary directory, removed afterwards
    say: object = None              # progress/messages sink (str -> None)
    live: bool = None               # redraw the progress line in place (None: stderr is a TTY)


class LabRun:
    def __init__(self, scenario, opts, td):
        self.scenario, self.opts, self.td = scenario, opts, td
        self.world = opts.ranks
        self.target = self.world - 1
        self.duration = float(opts.duration or scenario.duration)
        self.job = "lab-" + scenario.name
        self.say = opts.say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.manifest = {"scenario": scenario.name, "runner_pid": os.getpid(), "pgids": [],
                         "mounts": [], "cgroups": []}
        self.procs = []
        self.plans = []
        self.workdir = self.shard_dir = None
        self.agent = self.prom = None
        self.rules = []

    # -- resources -------------------------------------------------------------------
    def setup_dirs(self):
        if self.opts.workdir:
            self.workdir = os.path.abspath(self.opts.workdir)
            os.makedirs(self.workdir, exist_ok=True)
        else:
            self.workdir = tempfile.mkdtemp(prefix="stallscope-lab-", dir=needs.disk_dir())
            self.td.push("remove %s" % self.workdir, shutil.rmtree, self.workdir, ignore_errors=True)
        self.shard_dir = os.path.join(self.workdir, "shards")
        sources.make_shards(self.shard_dir, SHARDS["shards"], SHARDS["shard_bytes"])

    def created(self, kind, value):
        self.manifest[kind + "s"].append(value)
        with open(os.path.join(self.workdir, "manifest.json"), "w") as f:
            json.dump(self.manifest, f, indent=1)

    def spawn(self, name, cmd, env=None):
        p = teardown.popen(cmd, log=os.path.join(self.workdir, name + ".log"), env=procs.child_env(env))
        self.td.push("stop %s" % name, teardown.stop_group, p)
        self.created("pgid", p.pid)
        self.procs.append((name, p))
        return p

    def _serve(self, what, server):
        """Start an AgentProcess or PrometheusProcess, stopped by the teardown."""
        os.makedirs(server.dir, exist_ok=True)
        self.td.push("stop " + what, server.stop)
        server.start()
        self.created("pgid", server.proc.pid)
        return server

    def start_agent(self):
        return self._serve("the agent", procs.AgentProcess(
            args=findings.agent_args(self.duration), workdir=os.path.join(self.workdir, "agent"),
            popen_kwargs=teardown.session_kwargs()))

    def start_prometheus(self, agent):
        if self.opts.prometheus is False or not procs.shutil.which("prometheus"):
            return None
        self.rules = findings.rule_files(os.path.join(self.workdir, "rules"))
        return self._serve("prometheus", procs.PrometheusProcess(
            [agent.url], rule_files=self.rules, interval="1s",
            workdir=os.path.join(self.workdir, "prometheus"), popen_kwargs=teardown.session_kwargs()))

    # -- the job ---------------------------------------------------------------------
    def make_plans(self):
        master = "127.0.0.1:%d" % procs.free_port()
        for rank in range(self.world):
            plan = dict(BASE, rank=rank, world_size=self.world, master=master,
                        max_s=self.duration + READY_TIMEOUT_S + 600,
                        source=dict(SHARDS, dir=self.shard_dir))
            plan.update(self.scenario.everyone)
            if rank == self.target:
                plan.update(self.scenario.target)
            self.plans.append(plan)

    def start_ranks(self, fault):
        for rank, plan in enumerate(self.plans):
            path = os.path.join(self.workdir, "rank%d.json" % rank)
            with open(path, "w") as f:
                json.dump(plan, f, indent=1)
            cmd = pods.wrap([sys.executable, "-m", "stallscope.lab.trainer", path],
                            fault if rank == self.target else None, pods.make_cgroup(self, rank))
            self.spawn("rank%d" % rank, cmd, env=self.rank_env(rank))

    def rank_env(self, rank):
        return {"STALLSCOPE_SOCKET": self.agent.socket, "STALLSCOPE_JOB": self.job,
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(self.world),
                "POD_NAME": self.pod(rank), "POD_NAMESPACE": findings.NAMESPACE,
                "OMP_NUM_THREADS": "1"}

    def pod(self, rank):
        return "trainer-%d" % rank

    def check_alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise RuntimeError("%s exited with %s:\n%s" % (name, p.returncode, self.log_tail(name)))

    def log_tail(self, name, n=15):
        try:
            with open(os.path.join(self.workdir, name + ".log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def ranks(self):
        body = self.agent.api("/api/v1/ranks?job=" + self.job)
        return {r["rank"]: r for r in body["ranks"]}

    def wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            ranks = self.ranks()
            if len(ranks) == self.world and all(r["batches"] > 0 for r in ranks.values()):
                return ranks
            time.sleep(0.5)
        raise RuntimeError("the ranks did not start within %.0fs" % READY_TIMEOUT_S)


def fault_line(scenario, fault, target):
    if not scenario.stalls:
        return "no fault injected" + (" (every rank: %s)" % _changes(scenario.everyone) if scenario.everyone else "")
    if isinstance(fault, faults.NoFault):
        return "fault on rank %d: %s" % (target, _changes(scenario.target))
    return "fault on rank %d: %s" % (target, fault.summary)


def _changes(plan):
    return ", ".join("%s=%s" % kv for kv in sorted(plan.items()))


def run(scenario, opts):
    """Run ``scenario``; returns the result dict (see findings.result). Raises Unavailable
    when the machine lacks what the scenario needs, teardown.Interrupted on a signal."""
    fault = scenario.make_fault()
    reason = fault.missing()
    if reason:
        raise Unavailable("%s %s" % (scenario.name, reason))
    with teardown.Teardown() as td:
        lab = LabRun(scenario, opts, td)
        lab.say("lab: %s (%d ranks, %.0fs): %s" % (scenario.name, lab.world, lab.duration, scenario.title))
        lab.setup_dirs()
        lab.agent = lab.start_agent()
        lab.prom = lab.start_prometheus(lab.agent)
        lab.make_plans()
        fault.prepare(lab)
        lab.say("lab: %s" % fault_line(scenario, fault, lab.target))
        lab.start_ranks(fault)
        base = lab.wait_ready()
        t0 = time.monotonic()
        show = report.Progress(lab.say, lab.duration, lab.target, live=opts.live)
        fired = set()
        while True:
            elapsed = time.monotonic() - t0
            fault.tick(lab, elapsed)
            lab.check_alive()
            now = lab.ranks()
            show.update(elapsed, base, now)
            if lab.prom is not None and elapsed >= ALERTS_FROM_S:
                fired |= findings.firing(lab.prom)
            if elapsed >= lab.duration:
                break
            time.sleep(min(1.0, lab.duration - elapsed))
        show.done()
        result = findings.collect(lab, base, now, fired)
        if opts.record:
            result["recorded"] = findings.record(lab, result, opts.record)
        if opts.keep:
            report.keeping(lab, result)
            while True:
                lab.check_alive()
                time.sleep(1.0)
    return result
