"""One process cannot take its pod's connections (issue 50): within a sender domain, each
process (its PID as the kernel names it through SO_PEERCRED, whatever its messages
say) holds at most MAX_CONNECTIONS_PER_PROCESS, so the pod's other processes, each of
whose hooks needs one, still get theirs. Real unix sockets, real processes, an
in-process Ingest (no root needed: the processes share the test's uid and cgroup, hence
its domain)."""
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from stallscope.agent.identity import peer
from stallscope.agent.table import ingest
from tests.helpers import wait_until

# Connects N times (blocking: in order), says so, then reports once on every connection
# with the PID and pod it is told to claim, and holds them all until stdin closes.
HOLDER = textwrap.dedent(r"""
    import json, socket, sys
    path, n, claimed_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path)
        conns.append(s)
    print("connected", flush=True)
    msg = json.dumps({"v": 1, "kind": "report", "pid": claimed_pid, "role": "main",
                      "dropped_total": 0, "events": [],
                      "id": {"job": "j", "rank": 0, "pod": "p", "namespace": "", "node": ""}})
    for s in conns:
        try:
            s.send(msg.encode())
        except OSError:
            pass  # refused: the agent closed it
    print("sent", flush=True)
    sys.stdin.read()
""")


CAP = ingest.MAX_CONNECTIONS_PER_PROCESS
DOMAIN = 2 * CAP + CAP // 2


class Applied:
    def __init__(self):
        self.by_pid = {}
        self.lock = threading.Lock()

    def apply(self, msg, source):
        with self.lock:
            self.by_pid[source.pid] = self.by_pid.get(source.pid, 0) + 1


@pytest.fixture
def served(tmp_path):
    path = str(tmp_path / "hook.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(path)
    sock.listen(512)
    sock.setblocking(False)
    applied = Applied()
    # a smaller domain share, so that its bound is reached with a few processes
    ing = ingest.Ingest(sock, applied.apply, lambda pid, uid: peer.of_peer("/proc", pid, uid),
                        tick_s=0.05, max_per_domain=DOMAIN)
    ing.start()
    yield path, applied, ing
    ing.stop()
    sock.close()


def hold(path, n, claimed_pid=1):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, path, str(n), str(claimed_pid)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "connected"
    return p


def release(*procs):
    for p in procs:
        p.stdin.close()
        p.wait(timeout=30)


def test_one_process_holds_at_most_its_share_of_its_pods_connections(served):
    path, applied, ing = served
    cap = CAP
    stats = ing.stats
    # One process opens 3 x its cap, claiming in its messages to be PID 1: the kernel's
    # PID is the one counted. Its first `cap` stay open, the rest are closed, counted.
    greedy = hold(path, 3 * cap, claimed_pid=1)
    wait_until(lambda: stats.rejected["too_many_connections_per_process"] == 2 * cap, timeout=20)
    assert stats.connections == cap and stats.rejected["too_many_connections_per_sender"] == 0
    assert greedy.stdout.readline().strip() == "sent"
    wait_until(lambda: applied.by_pid.get(greedy.pid) == cap, timeout=20)  # its reports, no more
    # Another process of the same pod (domain) still gets its connection, and so does a
    # third, until the domain's own bound (DOMAIN here) is reached ...
    other = hold(path, 1)
    third = hold(path, cap)
    wait_until(lambda: stats.connections == 2 * cap + 1, timeout=20)
    assert other.stdout.readline().strip() == "sent"
    wait_until(lambda: applied.by_pid.get(other.pid) == 1, timeout=20)
    # ... which still holds for processes that each stay within their own share
    fourth = hold(path, cap)
    wait_until(lambda: stats.connections == DOMAIN, timeout=20)
    wait_until(lambda: stats.rejected["too_many_connections_per_sender"] == 3 * cap + 1 - DOMAIN, timeout=20)
    assert stats.rejected["too_many_connections_per_process"] == 2 * cap
    # A process that closes its connections gives its share back: its PID is forgotten.
    release(greedy)
    wait_until(lambda: stats.connections == DOMAIN - cap, timeout=20)
    assert (ing.stats.by_domain[next(iter(ing.stats.by_domain))] == DOMAIN - cap
            and all(pid != greedy.pid for (_d, pid) in stats.by_process))
    again = hold(path, 1)
    wait_until(lambda: stats.connections == DOMAIN - cap + 1, timeout=20)
    release(other, third, fourth, again)
    wait_until(lambda: stats.connections == 0 and not stats.by_process and not stats.by_domain, timeout=20)

