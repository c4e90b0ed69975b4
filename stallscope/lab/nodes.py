"""Lab nodes (issue 35): several GPU "nodes" on one machine, each with its own agent,
network, mounts and cgroup subtree, so that the judgements that cross nodes are made
across real boundaries: a victim's agent never hears from the straggler's, gloo's
all_reduce crosses veths, one Prometheus scrapes every node's agent through a bridge.

A node is
- a network namespace (ip-netns(8)) whose ``eth0`` is one end of a veth pair, the other
  end a port of the lab's bridge; the node's address is on the bridge's /24, the host
  holds the bridge's own address (Prometheus scrapes from there), and ``lo`` is up;
- a UTS namespace with the node's name as its hostname, and a mount namespace of its
  own (a copy of the host's, private propagation: unshare(1)) with a tmpfs of its own on
  /dev/shm, held by a sleeping process that every other process of the node joins with
  nsenter(1) (agent, ranks, and the pods' own mount namespaces made inside it; a FUSE
  fault's daemon mounts in a namespace made inside it too, faults/storage.py);
- a cgroup v2 directory under which its pods' cgroups are made;
- its own ``stallscope agent`` (``--node NAME``, its own hook socket), listening on the
  node's address.

Everything is registered with the session's Teardown before it is made and recorded in
its manifest (namespace, interfaces, cgroup, process groups), so Ctrl-C or a crash of a
test leaves nothing (tests/helpers/lab.py leftovers). Needs root and iproute2; without
them a node is only a name, with its agent on 127.0.0.1 in the host's namespaces.
"""
import os
import shutil
import subprocess

from ..processes import children, servers, teardown
from . import pods

SHM_SIZE = "256m"


def isolated():
    """Whether nodes get namespaces of their own here (root, ip, nsenter, unshare)."""
    return pods.isolated() and all(shutil.which(t) for t in ("ip", "nsenter"))


def _ip(*args):
    subprocess.run(("ip",) + args, check=True, capture_output=True, text=True)


def _quiet(*args):
    subprocess.run(args, capture_output=True)


class Network:
    """The lab's bridge; the host's address on it is .254 of a /24 chosen per lab
    process and session (the shaped store of faults/network.py uses 10.200-249; this uses
    10.150-199). Interface names are at most 15 bytes (IFNAMSIZ)."""

    made = 0  # sessions of this process that made a network: each gets its own names

    def __init__(self, session):
        self.session = session
        Network.made += 1
        self.tag = "%d%s" % (os.getpid() % 10000, chr(ord("a") + (Network.made - 1) % 26))
        self.bridge = "ssbr" + self.tag
        self.prefix = "10.%d.0" % (150 + (os.getpid() + Network.made - 1) % 50)
        self.host_ip = self.prefix + ".254"
        self.nodes = []
        self.up = False

    def create(self):
        td = self.session.td
        td.push("remove bridge %s" % self.bridge, _quiet, "ip", "link", "del", self.bridge)
        self.session.created("interface", self.bridge)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", self.host_ip + "/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.up = True

    def add(self, name):
        if isolated() and not self.up:
            self.create()
        node = Node(self, name, len(self.nodes))
        self.nodes.append(node)
        return node.start()


class Node:
    def __init__(self, network, name, index):
        self.network, self.session, self.name, self.index = network, network.session, name, index
        self.netns = "ssnd%s-%d" % (network.tag, index)
        self.veth = "ssv%s-%d" % (network.tag, index)  # the host's end; the node's end is its eth0
        self.isolated = isolated()
        self.ip = "%s.%d" % (network.prefix, index + 1) if self.isolated else "127.0.0.1"
        self.workdir = os.path.join(self.session.workdir, "node-" + name)
        self.holder = None
        self.cgroup = None
        self.agent = None

    def start(self):
        os.makedirs(self.workdir, exist_ok=True)
        if not self.isolated:
            return self
        s, td = self.session, self.session.td
        td.push("remove network namespace %s" % self.netns, _quiet, "ip", "netns", "del", self.netns)
        s.created("namespace", self.netns)
        _ip("netns", "add", self.netns)
        td.push("remove veth %s" % self.veth, _quiet, "ip", "link", "del", self.veth)
        s.created("interface", self.veth)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _ip("link", "set", self.veth, "master", self.network.bridge)
        _ip("link", "set", self.veth, "up")
        _ip("-n", self.netns, "addr", "add", self.ip + "/24", "dev", "eth0")
        _ip("-n", self.netns, "link", "set", "eth0", "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        # the holder: nsenter joins the network namespace, unshare makes the node's mount
        # and UTS namespaces, and the process sleeps in them (exec throughout: one PID,
        # which nsenter -t names). A sysfs mounted from inside the network namespace lists
        # its devices (sysfs(5)); only its net directories are bound over the host's, so
        # the cgroup mounts under /sys stay (`ip netns exec` remounts all of /sys)
        ready = os.path.join(self.workdir, "holder.ready")
        sysfs = os.path.join(self.workdir, "sysfs")
        os.makedirs(sysfs, exist_ok=True)
        script = (f"set -e; hostname {self.name}; "
                  f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs /dev/shm; "
                  f"mount -t sysfs sysfs {sysfs}; mount --bind {sysfs}/class/net /sys/class/net; "
                  f"mount --bind {sysfs}/devices/virtual/net /sys/devices/virtual/net; umount -l {sysfs}; "
                  # FUSE connections (the agent's waiting-request counts), where the kernel has them
                  f"mount -t fusectl fusectl /sys/fs/fuse/connections 2>/dev/null || true; "
                  f": > {ready}; exec sleep 2147483647")
        self.holder = s.popen("node %s" % self.name, os.path.join(self.workdir, "holder.log"),
                              ["nsenter", "--net=/run/netns/" + self.netns, "--", "unshare", "--mount",
                               "--uts", "--propagation", "private", "--", "sh", "-c", script])
        if not teardown.wait_for(lambda: os.path.exists(ready) or self.holder.poll() is not None, 10) \
                or self.holder.poll() is not None:
            raise RuntimeError("lab node %s did not start: %s" % (self.name, _tail(self.workdir)))
        base = pods.v2_root()
        if base is not None:
            self.cgroup = os.path.join(base, "stallscope-lab-%d-node-%s" % (os.getpid(), self.name))
            td.push("remove cgroup %s" % self.cgroup, teardown.rmdir_cgroup, self.cgroup)
            os.mkdir(self.cgroup)
            s.created("cgroup", self.cgroup)
        return self

    def enter(self):
        """The command prefix that runs a command in the node (its network, mount and UTS
        namespaces); empty where nodes are not isolated."""
        if not self.isolated:
            return []
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--mount", "--uts", "--"]

    def start_agent(self, args):
        """The node's agent, ``args`` its flags (``--node`` this node's name, last)."""
        self.agent = self.session._serve("the agent of node %s" % self.name, servers.AgentProcess(
            args=list(args) + ["--node", self.name], workdir=os.path.join(self.workdir, "agent"),
            popen_kwargs=children.session_kwargs(), host=self.ip, prefix=self.enter()))
        return self.agent

    def rx_bytes(self):
        """Bytes the host's end of the node's veth received (what the node sent), from
        /sys/class/net (the kernel's count); None where the node is not isolated."""
        if not self.isolated:
            return None
        with open("/sys/class/net/%s/statistics/rx_bytes" % self.veth) as f:
            return int(f.read())


def _tail(workdir):
    try:
        with open(os.path.join(workdir, "holder.log"), errors="replace") as f:
            return f.read()[-1000:]
    except OSError:
        return ""
