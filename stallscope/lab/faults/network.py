"""Network faults: the target rank's samples come over a link that the kernel shapes.

``ShapedStore``: the lab's object store (objstore.py) runs in a network namespace of its
own, behind a veth pair whose far end's egress (every response to the trainer) passes a
token bucket (``tc qdisc ... tbf``, tc-tbf(8)): the link carries ``rate`` bytes a second
and no more, however many connections share it, as a node's front-end NIC or a cloud
instance's bandwidth allowance does. The agent reads the near end as the link (the
lab tells it the capacity, as an operator tells it an instance's allowance:
``--exporter.links.capacity``). The store's own log says what it served.
"""
import os
import subprocess
import sys

from ...processes import servers, teardown
from .. import objstore
from .base import Fault
from .storage import http_up


def _names():
    """(namespace, host-side interface, namespace-side interface, subnet's second octet):
    one set per lab process, so the agent's flags (made before the fault is prepared)
    name the interface the fault makes."""
    tag = "ssbw%d" % (os.getpid() % 10000)
    return tag, tag + "h", tag + "n", 200 + os.getpid() % 50


def _ip(*args):
    subprocess.run(("ip",) + args, check=True, capture_output=True, text=True)


def _quiet(*args):
    subprocess.run(args, capture_output=True)


class ShapedStore(Fault):
    needs = ("root", "netns")
    # the lab also diagnoses the rank from Prometheus alone (issue 31: the cause named
    # first on both paths); a second diagnose costs a CI run a second or two a scenario
    both_paths = True

    def __init__(self, rate=6e6, latency=0.002, read_kib=256, reads=1, error_rate=0.0, timed=True):
        self.rate, self.latency, self.read_kib, self.reads = rate, latency, read_kib, reads
        self.timed = timed  # False: plain GETs, nothing reported (lab/sampler.py)
        self.error_rate = error_rate
        self.log = None
        self.summary = ("the target rank reads every sample (%d KiB) from an object store in a "
                        "network namespace behind a veth link shaped to %.3g MB/s by a tc token "
                        "bucket" % (read_kib * reads, rate / 1e6))
        if error_rate:
            self.summary += "; the store answers 503 to %.0f%% of GETs" % (100 * error_rate)

    def agent_args(self):
        _, host_if, _, _ = _names()
        return ["--exporter.links.include", host_if,
                "--exporter.links.capacity", "%s=%d" % (host_if, self.rate)]

    def prepare(self, run):
        ns, host_if, ns_if, octet = _names()
        host_ip, store_ip = "10.%d.1.1" % octet, "10.%d.1.2" % octet
        run.td.push("remove network namespace %s" % ns, _quiet, "ip", "netns", "del", ns)
        run.created("namespace", ns)
        _ip("netns", "add", ns)
        run.td.push("remove veth %s" % host_if, _quiet, "ip", "link", "del", host_if)
        run.created("interface", host_if)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        _ip("addr", "add", host_ip + "/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", store_ip + "/30", "dev", ns_if)
        _ip("-n", ns, "link", "set", ns_if, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # the bucket holds a burst of 64 KiB and queues 200 ms: the link's rate is its rate
        # within a fraction of a second, as a NIC's line rate is
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns_if, "root", "tbf",
                        "rate", "%dbit" % int(self.rate * 8), "burst", "64kb", "latency", "200ms"],
                       check=True, capture_output=True)
        port = servers.free_port()
        self.log = os.path.join(run.workdir, "objstore-served.log")
        run.spawn("objstore", ["ip", "netns", "exec", ns, sys.executable, "-m", "stallscope.lab.objstore",
                               run.shard_dir, str(port), "--host", store_ip, "--latency", str(self.latency),
                               "--log", self.log, "--error-rate", str(self.error_rate)])
        url = "http://%s:%d" % (store_ip, port)
        if not teardown.wait_for(lambda: http_up(url), 15):
            raise RuntimeError("the shaped object store did not start:\n" + run.log_tail("objstore"))
        plan = run.plans[run.target]
        plan["reads_per_sample"] = self.reads
        plan["source"] = {"kind": "cached", "cache_dir": None, "remote_url": url,
                          "shards": plan["source"]["shards"], "read_bytes": self.read_kib * 1024,
                          "timed": self.timed}

    def served(self, run):
        """What the store served against what the agent counted, over one window: the
        bytes of the target rank's shard reads (the agent's per-read samples) and of the
        store's 2xx answers (its log) that ended in it, both on CLOCK_MONOTONIC, a second
        in from either end of the agent's record."""
        if not self.log or not os.path.exists(self.log):
            return None
        body = run.agent.api("/api/v1/timeline?job=%s&rank=%d&seconds=%d" % (
            run.job, run.target, int(run.duration) + 30))
        points = body.get("signals", {}).get("shard_read_bytes") or []
        if len(points) < 3:
            return None
        since, until = points[0][0] + 1_000_000_000, points[-1][0] - 1_000_000_000
        agent = sum(v for t, v in points if since <= t <= until)
        gets, store = objstore.served_bytes(self.log, since, until)
        return {"window_seconds": round((until - since) / 1e9, 3), "store_gets": gets,
                "store_bytes": store, "agent_bytes": int(agent),
                "relative_error": round(agent / store - 1, 4) if store else None}
