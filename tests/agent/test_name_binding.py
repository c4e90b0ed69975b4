"""Pod names outside Kubernetes (issue 33, item 2): a name no pod map vouches for stays
bound to its first claimant's uid and cgroup for the agent's life, until that cgroup is
gone by the kernel's record (a finished job), and ``--identity.allow`` pins names to
uids and cgroups. Real agent processes; senders are real processes in real cgroups of
the v2 hierarchy, as root or as uid 65534."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tracemalloc

import pytest

from stallscope.agent.identity import kubepods, names, peer
from stallscope.agent.identity.allowlist import AllowList, parse
from stallscope.agent.identity.refusal import Refused
from stallscope.agent.table.budget import Budget
from stallscope.processes.children import child_env
from tests.agent.test_hostile import batch, rejected, report, samples, wait_until
from tests.helpers.needs import as_nobody, need_root

SENDER = r"""
import json, os, socket, sys
print("ready", flush=True)
sys.stdin.readline()                 # moved into its cgroup by the test meanwhile
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
for m in json.loads(sys.argv[2]):
    m["pid"] = os.getpid()
    s.send(json.dumps(m).encode())
print("sent", flush=True)
sys.stdin.readline()                 # lives until the test ends it
"""


def v2_base():
    need_root()
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(os.path.join(base, "cgroup.controllers")) and os.access(base, os.W_OK):
            return base
    pytest.skip("needs a writable cgroup v2 hierarchy")


class Cgroup:
    """A real v2 cgroup, as a Slurm job's or a systemd scope's would be."""

    def __init__(self, base, name):
        self.dir = os.path.join(base, "stallscope-test-%d-%s" % (os.getpid(), name))
        os.makedirs(self.dir)
        self.path = "/" + os.path.relpath(self.dir, base)   # as /proc/PID/cgroup names it

    def remove(self):
        if os.path.isdir(self.dir):
            os.rmdir(self.dir)


@pytest.fixture
def cgroups():
    base = v2_base()
    made = []

    def make(name):
        made.append(Cgroup(base, name))
        return made[-1]
    yield make
    for cg in made:
        try:
            cg.remove()
        except OSError:
            pass


@pytest.fixture
def senders():
    started = []

    def send(agent, cgroup, *msgs, nobody=False):
        """A process in ``cgroup`` (as uid 65534 when ``nobody``) sends ``msgs``; it lives
        until ``end(p)``."""
        cmd = [sys.executable, "-c", SENDER, agent.socket, json.dumps(list(msgs))]
        p = subprocess.Popen(as_nobody(cmd) if nobody else cmd, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=child_env())
        started.append(p)
        assert p.stdout.readline().strip() == "ready"
        with open(os.path.join(cgroup.dir, "cgroup.procs"), "w") as f:
            f.write(str(p.pid))
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "sent"
        return p
    yield send
    for p in started:
        p.kill()
        p.wait()


def end(p):
    p.stdin.close()
    assert p.wait(10) == 0


def claim(pod, job="train", rank=0, namespace="ns"):
    m = json.loads(report(rank=rank, job=job, pod=pod, events=[batch(0.002, 0.1)]))
    m["id"]["namespace"] = namespace
    return m


def counts(agent, **labels):
    return samples(agent, "stallscope_data_wait_seconds_count", **labels)


def ranks(agent):
    return agent.api("/api/v1/ranks")["ranks"]


def test_a_departed_trainers_name_is_refused_to_another_uid_and_cgroup(agent_factory, cgroups, senders):
    """On main before this (8a4eb16 and 584e9ee) the squatter's report was accepted once
    the trainer's rank had gone (7 s after its exit in the probe): its 1000 s of
    data-wait fed the victim's job."""
    agent = agent_factory("--socket-mode", "0666", "--rank-exit-grace", "0")
    trainer_cg, squatter_cg = cgroups("trainer"), cgroups("squatter")
    trainer = senders(agent, trainer_cg, claim("victim"))
    wait_until(lambda: counts(agent, pod="victim") == [1])
    end(trainer)
    wait_until(lambda: ranks(agent) == [])  # its rank went: the live-rank rule lapsed
    squat = claim("victim")
    squat["events"] = [[squat["events"][0][0], 1000 * 10**9, 1000 * 10**9]]
    senders(agent, squatter_cg, squat, nobody=True)
    wait_until(lambda: rejected(agent, "identity_mismatch") == 1)
    assert counts(agent, pod="victim") == [] and ranks(agent) == []
    # The trainer's own domain (its uid and cgroup: a restart) takes its name back.
    senders(agent, trainer_cg, claim("victim"))
    wait_until(lambda: counts(agent, pod="victim") == [1])
    assert samples(agent, "stallscope_agent_name_bindings") == [1]
    assert samples(agent, "stallscope_agent_name_bindings_released_total") == [0]


def test_successive_slurm_jobs_take_the_hostname_once_the_last_jobs_cgroup_is_gone(
        agent_factory, cgroups, senders):
    """The hook's pod defaults to the hostname on bare metal: every Slurm job on the node
    claims it. slurmstepd removes a job's cgroup when it ends; the next job, another user
    in another cgroup, reports at once (not after the exit grace: default 30 s here)."""
    agent = agent_factory("--socket-mode", "0666")
    host = socket.gethostname()
    job1 = cgroups("job_101")
    first = senders(agent, job1, claim(host, job="101", namespace=""))
    wait_until(lambda: counts(agent, pod=host, job="101") == [1])
    end(first)
    job1.remove()                                  # the job ended: its cgroup goes
    job2 = cgroups("job_102")
    senders(agent, job2, claim(host, job="102", namespace=""), nobody=True)
    wait_until(lambda: counts(agent, pod=host, job="102") == [1])
    assert rejected(agent, "identity_mismatch") == 0
    assert samples(agent, "stallscope_agent_name_bindings_released_total") == [1]
    # Job 102 now holds the name while its cgroup exists: a third uid/cgroup is refused.
    senders(agent, cgroups("job_other"), claim(host, job="103", namespace=""))
    wait_until(lambda: rejected(agent, "identity_mismatch") == 1)
    assert counts(agent, pod=host, job="103") == []


def test_a_finished_jobs_name_binding_is_released_after_its_ranks_went(agent_factory, cgroups, senders):
    agent = agent_factory("--socket-mode", "0666", "--rank-exit-grace", "0")
    job1 = cgroups("job_201")
    end(senders(agent, job1, claim("node-x", job="201", namespace="")))
    wait_until(lambda: ranks(agent) == [] and rejected(agent, "identity_mismatch") == 0)
    job1.remove()
    senders(agent, cgroups("job_202"), claim("node-x", job="202", namespace=""), nobody=True)
    wait_until(lambda: counts(agent, pod="node-x", job="202") == [1])
    assert samples(agent, "stallscope_agent_name_bindings_released_total") == [1]


def write(path, text, mtime_ns=None):
    """Replace the file at once (rename), with ``mtime_ns`` already set when given: the
    agent never sees another mtime, so only SIGHUP makes it read the new text."""
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(text)
    if mtime_ns is not None:
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def test_the_allow_list_pins_a_name_and_is_reloaded(agent_factory, cgroups, senders, tmp_path):
    a, b, c = cgroups("alice"), cgroups("bob"), cgroups("carol")
    allow = str(tmp_path / "allow")
    write(allow, "# pinned by the admins\nns/pinned   uid=65534 cgroup=%s  # bob's job\n" % b.path)
    agent = agent_factory("--socket-mode", "0666", "--identity.allow", allow)
    senders(agent, a, claim("pinned", rank=0))                    # root, another cgroup
    senders(agent, c, claim("pinned", rank=1), nobody=True)       # its uid, another cgroup
    wait_until(lambda: rejected(agent, "not_allowed") == 2)
    senders(agent, b, claim("pinned", rank=2), nobody=True)       # its uid and cgroup
    wait_until(lambda: counts(agent, pod="pinned", rank="2") == [1])
    # A name not in the file follows the binding rule: a's, then not c's.
    senders(agent, a, claim("free", rank=0))
    senders(agent, c, claim("free", rank=1), nobody=True)
    wait_until(lambda: rejected(agent, "identity_mismatch") == 1)
    # SIGHUP reloads (the mtime kept as it was: the signal alone): now root in a, by a glob.
    mtime = os.stat(allow).st_mtime_ns
    write(allow, "ns/pinned uid=0 cgroup=/stallscope-test-*-alice\n", mtime_ns=mtime)
    time.sleep(1.5)  # polled at least once: the same mtime, not read again
    senders(agent, a, claim("pinned", rank=5))
    wait_until(lambda: rejected(agent, "not_allowed") == 3)
    agent.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: any("1 names" in x for x in open(agent.log)))
    senders(agent, a, claim("pinned", rank=3))
    wait_until(lambda: counts(agent, pod="pinned", rank="3") == [1])
    # A bad file (its mtime changed): counted, one line, the entries before still hold.
    write(allow, "ns/pinned uid=0\nns/other uid=root\n")
    wait_until(lambda: samples(agent, "stallscope_agent_allowlist_reload_failures_total") == [1])
    lines = [x for x in open(agent.log) if "--identity.allow" in x and ":2:" in x]
    assert len(lines) == 1 and "uid=root" in lines[0], lines
    senders(agent, b, claim("pinned", rank=4), nobody=True)
    wait_until(lambda: rejected(agent, "not_allowed") == 4)
    assert counts(agent, pod="pinned", rank="4") == []


@pytest.mark.parametrize("text, why", [
    ("ns/a uid=1000\nns/b uid=x\n", ":2: uid=x is not a uid"),
    ("ns/a\n", ":1: ns/a: give uid=N, cgroup=PATH or both"),
    ("ns/a cgroup=relative/path\n", ":1: cgroup=relative/path is not an absolute path"),
    ("ns/a uid=1 color=red\n", ":1: 'color=red': expected uid=N or cgroup=PATH"),
])
def test_a_bad_allow_list_exits_2_with_one_line_and_binds_nothing(tmp_path, text, why):
    allow = tmp_path / "allow"
    allow.write_text(text)
    sock = tmp_path / "hook.sock"
    out = subprocess.run([sys.executable, "-m", "stallscope", "agent", "--listen", "127.0.0.1:0",
                          "--socket", str(sock), "--identity.allow", str(allow)],
                         capture_output=True, text=True, timeout=60, env=child_env())
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and str(allow) in lines[0], out.stderr
    assert not sock.exists()
    missing = subprocess.run([sys.executable, "-m", "stallscope", "agent", "--listen", "127.0.0.1:0",
                              "--socket", str(sock), "--identity.allow", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=60, env=child_env())
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def source(uid, cgroup, pid=1000, v1=()):
    return peer.Source(pid, uid, 1, None, None, cgroup, (), v1)


def v1_of(path):
    """A hybrid host's v1 paths, fresh strings each time (as each connection reads them)."""
    return tuple((c, "".join(p)) for c, p in (("cpu", "/"), ("memory", path), ("name=systemd", path),
                                              ("pids", "/"), ("blkio", "/")))


@pytest.mark.parametrize("path_len", [60, 3000])
def test_bindings_are_bounded_and_a_flooder_evicts_its_own(tmp_path, path_len):
    """At most MAX_BINDINGS names and MAX_BINDING_BYTES (a long cgroup path costs more);
    past that the oldest of the uid holding the most goes, so names claimed by one
    user in a loop, each from a cgroup of its own, evict its own bindings, never a
    neighbour's; every eviction is counted; what they hold is within what the memory
    ceiling counts (budget.py)."""
    n = names.Names(str(tmp_path))          # no hierarchy there: no cgroup is ever gone
    victim = source(1000, "/user.slice/user-1000.slice/session-3.scope")
    n.bind(("", "node01"), victim, "binding")
    long = "n" * 128
    claims = names.MAX_BINDINGS + 1000
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(claims):   # a new connection each: its own strings from /proc
        path = "/user.slice/user-65534.slice/" + ("%06d" % i).ljust(path_len, "x")
        n.bind(("ns" + long[:126], "%06d" % i + long[:122]),
               source(65534, path[:-1] + path[-1], pid=2000 + i, v1=v1_of(path)), "binding")
    used = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert 0 < used <= n.bytes <= names.MAX_BINDING_BYTES, (used, n.bytes)
    assert len(n) <= names.MAX_BINDINGS
    assert n.evicted == claims + 1 - len(n) and n.evicted >= 1000
    if path_len > 1000:
        assert len(n) < names.MAX_BINDINGS / 2   # the byte cap bit first
    assert n.bindings[("", "node01")].domain == victim.domain   # still the victim's
    with pytest.raises(Refused):
        n.check(("", "node01"), source(65534, "/user.slice/user-65534.slice/000000"))
    b = Budget(64, 900)
    assert b.bindings_bytes() == names.MAX_BINDING_BYTES
    assert "%d names at most" % names.MAX_BINDINGS in b.describe()


def test_the_allow_list_format():
    got = parse("# c\n\nteam/p1 uid=7 cgroup=/slurm/job_*   # two\nteam/p1 uid=8\nnode02 uid=9\n"
                "/node03 cgroup=/a\n", "f")
    assert set(got) == {("team", "p1"), ("", "node02"), ("", "node03")}
    e1, e2 = got[("team", "p1")]
    assert e1.admits(source(7, "/slurm/job_12/step_0")) and not e1.admits(source(7, "/other"))
    assert not e1.admits(source(8, "/slurm/job_12")) and e2.admits(source(8, "/anything"))
    assert AllowList().get(("team", "p1")) is None


def test_the_pod_maps_word_wins_over_a_binding(tmp_path):
    """While the API server is down a recreated pod (a StatefulSet's trainer-0, a new
    UID) is refused its old name; once the map is current and places it under that name,
    the name is bound to it and the old pod is refused."""
    pods = kubepods.PodMap()
    n = names.Names(str(tmp_path), pods)
    old = peer.Source(10, 0, 1, "uid-old", "c1", "/../kubepods/podold/c1")
    new = peer.Source(11, 0, 1, "uid-new", "c2", "/../kubepods/podnew/c2")
    name = ("team", "trainer-0")
    assert n.rule(name, old) == "binding"
    n.bind(name, old, "binding")
    with pytest.raises(Refused):
        n.check(name, new)           # the map is down: the binding holds
    pods.replace({"uid-new": kubepods.PodName("team", "trainer-0")})
    assert n.rule(name, new) == "pod_map" and n.rule(name, old) == "binding"
    n.bind(name, new, "pod_map")
    n.check(name, new)
    with pytest.raises(Refused):
        n.check(name, old)
