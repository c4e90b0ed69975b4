"""Issue 14's weaknesses, each reproduced against a real agent process over its real
socket: what any process on the node could do to it, and what it must not achieve."""
import json
import os
import socket
import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

from stallscope.processes.children import child_env
from stallscope.processes.servers import http_get
from tests.helpers.needs import as_nobody, need_root


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s


def report(rank=0, job="j", pod="victim", events=(), **more):
    msg = {"v": 1, "kind": "report", "pid": os.getpid(), "role": "main", "dropped_total": 0,
           "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns(),
           "id": {"job": job, "rank": rank, "pod": pod, "namespace": "ns", "node": "n"},
           "events": [list(e) for e in events]}
    msg.update(more)
    return json.dumps(msg).encode()


def batch(wait_s, interval_s, ago_s=0.0):
    end = time.monotonic_ns() - int(ago_s * 1e9)
    return (end, int(wait_s * 1e9), int(interval_s * 1e9))


def wait_until(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in %.0fs" % timeout)


def samples(agent, name, **labels):
    text = agent.metrics()
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name and set(labels.items()) <= set(s.labels.items())]


def rejected(agent, reason):
    return sum(samples(agent, "stallscope_agent_rejected_messages_total", reason=reason))


def test_a_lone_surrogate_is_refused_and_metrics_stay_up(agent):
    escaped = report(job="\ud800")                                  # JSON escape
    raw = report(job="PLACEHOLDER").replace(b"PLACEHOLDER", b"\xed\xa0\x80")  # raw bytes
    s = connect(agent.socket)
    s.send(escaped)
    s.send(raw)
    s.send(report(rank=1, events=[batch(0.001, 0.01)]))
    wait_until(lambda: rejected(agent, "bad_label") == 2)
    text = http_get(agent.url + "/metrics")  # 200, and every line parses
    assert list(text_string_to_metric_families(text))
    assert samples(agent, "stallscope_data_wait_seconds_count", rank="1") == [1]
    s.close()


def test_a_zero_length_message_is_a_counted_reject_and_the_connection_goes_on(agent):
    s = connect(agent.socket)
    s.send(b"")
    for rank in range(5):
        s.send(report(rank=rank, events=[batch(0.001, 0.01)]))
    wait_until(lambda: samples(agent, "stallscope_agent_messages_total") == [5])
    assert rejected(agent, "empty") == 1
    assert len(samples(agent, "stallscope_data_wait_seconds_count")) == 5
    s.close()


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def test_huge_event_times_are_refused_and_cost_no_memory(agent_factory):
    agent = agent_factory("--gpu.simulated", "--no-gpu.nvml", "--exporter.interval", "0.2")
    s = connect(agent.socket)
    s.send(report(events=[batch(0.001, 0.01)]))  # a real rank, with its simulated GPU
    wait_until(lambda: samples(agent, "stallscope_agent_messages_total") == [1])
    before = rss_kib(agent.proc.pid)
    for _ in range(200):
        s.send(report(events=[(2**62, 0, 2**62)]))
        s.send(report(events=[(time.monotonic_ns(), 0, 2**61)]))
    wait_until(lambda: rejected(agent, "bad_time") == 400, timeout=20)
    time.sleep(2.0)  # several GPU sampling rounds
    grown = rss_kib(agent.proc.pid) - before
    assert grown < 20 * 1024, "RSS grew %d KiB" % grown  # was ~50 MB a second
    s.close()


ATTACKER = r"""
import json, os, socket, sys, time
path, victim_pid = sys.argv[1], int(sys.argv[2])
def msg(**kw):
    m = {"v": 1, "kind": "report", "pid": os.getpid(), "role": "main", "dropped_total": 0,
         "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns(),
         "id": {"job": "j", "rank": 0, "pod": "victim", "namespace": "ns", "node": "n"},
         "events": [[time.monotonic_ns(), 1000 * 10**9, 1000 * 10**9]]}
    m.update(kw)
    return json.dumps(m).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
s.send(msg())                                                  # impersonate the live rank
s.send(msg(id={"job": "j", "rank": 7, "pod": "victim", "namespace": "ns", "node": "n"}))
s.send(msg(role="worker"))                                     # as one of its workers
now = time.monotonic_ns()                                      # bytes and failed requests for its tier
s.send(msg(events=[], io={"tiers": ["s3"], "reads": [[now, 1000, 10**9, 0]],
                          "requests": [[0, 0, 50, 0, 0, 0, 0]]}))
s.send(msg(id={"job": "a", "rank": 0, "pod": "mine", "namespace": "ns", "node": "n"},
           events=[], loader={"num_workers": 1, "worker_pids": [1, victim_pid]}))
s.close()
print("sent", flush=True)
"""


def test_an_unprivileged_process_cannot_touch_another_pods_series(agent_factory):
    need_root()
    agent = agent_factory("--socket-mode", "0666")  # it may connect: what can it do then?
    s = connect(agent.socket)  # the victim: root, in this test's cgroup
    s.send(report(events=[batch(0.002, 0.1)], loader={"num_workers": 0, "worker_pids": []}))
    wait_until(lambda: samples(agent, "stallscope_data_wait_seconds_count", pod="victim") == [1])
    before = samples(agent, "stallscope_data_wait_seconds_sum", pod="victim")
    out = subprocess.run(as_nobody([sys.executable, "-c", ATTACKER, agent.socket, str(os.getpid())]),
                         capture_output=True, text=True, timeout=60, env=child_env())
    assert out.stdout.strip() == "sent", out.stderr
    wait_until(lambda: rejected(agent, "identity_mismatch") == 4)
    # Not a sample in the victim's series; no rank 7 in its pod; its own rank kept; no
    # bytes or failed requests of a tier of its (issue 31)
    assert samples(agent, "stallscope_data_wait_seconds_sum", pod="victim") == before
    assert samples(agent, "stallscope_shard_read_bytes_total", pod="victim") == []
    assert samples(agent, "stallscope_storage_failed_requests_total", pod="victim") == []
    assert samples(agent, "stallscope_data_wait_seconds_count", pod="victim", rank="7") == []
    ranks = {(r["pod"], r["rank"]): r for r in agent.api("/api/v1/ranks")["ranks"]}
    assert set(ranks) == {("victim", 0), ("mine", 0)}
    # Its own rank is its own; the workers it named are not its descendants: never read.
    assert ranks[("mine", 0)]["worker_pids"] == []
    assert samples(agent, "stallscope_agent_refused_worker_pids_total") == [2]
    assert samples(agent, "stallscope_loader_workers_alive", pod="mine") == []
    s.close()


def test_a_trainers_real_workers_are_accepted(agent, tmp_path):
    """The rules above do not refuse what a real trainer does: its workers descend."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        s = connect(agent.socket)
        s.send(report(pod="good", events=[batch(0.002, 0.1)],
                      loader={"num_workers": 1, "worker_pids": [child.pid]}))
        wait_until(lambda: agent.api("/api/v1/ranks")["ranks"])
        (r,) = agent.api("/api/v1/ranks")["ranks"]
        assert r["worker_pids"] == [child.pid]
        s.close()
    finally:
        child.kill()
        child.wait()


def test_the_socket_is_recreated_when_removed_or_replaced(agent):
    def scrape_count():
        return sum(samples(agent, "stallscope_agent_socket_recreated_total"))

    os.unlink(agent.socket)
    wait_until(lambda: os.path.exists(agent.socket) and scrape_count() == 1, timeout=5)
    assert http_get(agent.url + "/healthz") == "ok\n"
    # A squatter binds the path (only root can: the directory is the agent's).
    os.unlink(agent.socket)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    squatter.bind(agent.socket)
    squatter.listen(1)
    wait_until(lambda: scrape_count() == 2, timeout=5)
    s = connect(agent.socket)  # a new trainer reaches the agent, not the squatter
    s.send(report(pod="after", events=[batch(0.001, 0.01)]))
    wait_until(lambda: samples(agent, "stallscope_data_wait_seconds_count", pod="after") == [1])
    s.close()
    squatter.close()


def test_a_socket_directory_others_may_write_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    out = subprocess.run([sys.executable, "-m", "stallscope", "agent", "--listen", "127.0.0.1:0",
                          "--socket", str(d / "hook.sock")], capture_output=True, text=True,
                         timeout=60, env=child_env())
    assert out.returncode == 1
    assert out.stderr.strip().endswith("writable by other users: anyone could replace the socket "
                                       "(chmod 755 it, or use a directory of the agent's own)")
    assert "Traceback" not in out.stderr


def padded_worker_report(rank):
    """A worker's report for a rank that never comes, padded to the message limit with
    nested JSON (~1.4 MB of Python objects for 64 KiB on the wire: issue 33)."""
    from stallscope.hook import wire

    head = report(rank=rank, pod="ghost", role="worker", pad=[])
    room = wire.MAX_MESSAGE_BYTES - len(head) - 16
    return head.replace(b'"pad": []', b'"pad": [' + b",".join([b"{}"] * (room // 3)) + b"]")


def test_a_flood_of_padded_held_reports_stays_under_the_daemonsets_limit(agent_factory):
    from stallscope.agent.table.held import MAX_HELD_BYTES_PER_DOMAIN

    agent = agent_factory("--max-ranks", "32")
    s = connect(agent.socket)
    s.setblocking(True)
    s.send(report(pod="real", events=[batch(0.001, 0.01)]))
    wait_until(lambda: samples(agent, "stallscope_agent_messages_total") == [1])
    before = rss_kib(agent.proc.pid)
    flood = [padded_worker_report(r) for r in range(1, 401)]
    assert min(len(m) for m in flood) > 60000
    for m in flood:
        s.send(m)
    # Held up to this sender's share, every other one refused and counted (was: all
    # 400 held whole, RSS 59 -> 663-873 MB; the DaemonSet's limit is 256 MiB).
    wait_until(lambda: samples(agent, "stallscope_agent_held_messages") and
               samples(agent, "stallscope_agent_held_messages")[0] + rejected(agent, "held_limit") == 400,
               timeout=60)
    held = samples(agent, "stallscope_agent_held_messages")[0]
    assert 0 < held < MAX_HELD_BYTES_PER_DOMAIN / 2048  # each costs at least ENTRY_BYTES
    peak = rss_kib(agent.proc.pid)
    assert peak < 256 * 1024, "RSS %d KiB" % peak
    assert peak - before < 48 * 1024, "RSS grew %d KiB" % (peak - before)
    s.close()


HOARDER = r"""
import os, resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (5000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
path, processes, each = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns = []
for _ in range(processes):  # one after another: the agent accepts them in this order
    r, w = os.pipe()
    if os.fork() == 0:
        held = []
        for _ in range(each):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path)
            held.append(s)
        os.write(w, b"x")
        os.read(0, 1)  # held until stdin closes
        os._exit(0)
    os.read(r, 1)
print("holding", flush=True)
sys.stdin.read()
"""


def test_one_senders_idle_connections_do_not_lock_a_trainer_out(agent_factory):
    # Issue 33: 4,096 idle connections from one process filled the global cap; a real
    # trainer's batches were then never seen. Now one sender domain holds at most 512,
    # and one process of it at most 64 (issue 50): 12 processes asking 128 each.
    from stallscope.agent.table.ingest import MAX_CONNECTIONS_PER_DOMAIN, MAX_CONNECTIONS_PER_PROCESS

    need_root()
    agent = agent_factory("--socket-mode", "0666")  # a sender that may connect at all
    processes, each = 12, 2 * MAX_CONNECTIONS_PER_PROCESS
    hoarder = subprocess.Popen(as_nobody([sys.executable, "-c", HOARDER, agent.socket,
                                          str(processes), str(each)]),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert hoarder.stdout.readline().strip() == "holding"
        filled = MAX_CONNECTIONS_PER_DOMAIN // MAX_CONNECTIONS_PER_PROCESS  # processes until full
        wait_until(lambda: rejected(agent, "too_many_connections_per_process") +
                   rejected(agent, "too_many_connections_per_sender") == processes * each - 512, timeout=30)
        # each process past its own share, until the one that filled the domain's: past
        # that, the domain's bound refuses first
        per_process = rejected(agent, "too_many_connections_per_process")
        assert per_process == (filled - 1) * MAX_CONNECTIONS_PER_PROCESS
        assert rejected(agent, "too_many_connections_per_sender") == \
            (processes - filled) * each + MAX_CONNECTIONS_PER_PROCESS
        assert samples(agent, "stallscope_agent_connections") == [MAX_CONNECTIONS_PER_DOMAIN]
        s = connect(agent.socket)  # the trainer: another domain (root, not uid 65534)
        s.send(report(pod="trainer", events=[batch(0.002, 0.1)]))
        wait_until(lambda: samples(agent, "stallscope_data_wait_seconds_count", pod="trainer") == [1])
        assert rejected(agent, "too_many_connections") == 0
        s.close()
    finally:
        hoarder.stdin.close()  # its processes end with it
        try:
            hoarder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            hoarder.kill()
            hoarder.wait()


def test_a_connection_silent_past_the_idle_timeout_is_closed_and_counted(agent_factory):
    agent = agent_factory("--hook-idle-timeout", "1")
    quiet, busy = connect(agent.socket), connect(agent.socket)
    quiet.send(report(pod="quiet", events=[batch(0.001, 0.01)]))
    sent, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 3.5:  # the busy one reports every 0.3 s: kept
        busy.send(report(pod="busy", events=[batch(0.001, 0.01)]))
        sent += 1
        time.sleep(0.3)
    quiet.settimeout(5)
    from stallscope.hook.wire import ACK
    assert quiet.recv(100) == ACK.pack(1)  # its report was taken (hook/wire.py)
    assert quiet.recv(100) == b""  # then closed by the agent
    assert samples(agent, "stallscope_agent_connections_closed_total", reason="idle") == [1]
    assert samples(agent, "stallscope_agent_connections") == [1]
    wait_until(lambda: samples(agent, "stallscope_data_wait_seconds_count", pod="busy") == [sent])
    assert samples(agent, "stallscope_data_wait_seconds_count", pod="quiet") == [1]  # its rank stays
    quiet.close()
    busy.close()


CONNECT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(sys.argv[1])
    print("connected")
except PermissionError:
    print("refused")
"""


def test_the_socket_admits_only_the_agents_user_and_group_by_default(agent_factory):
    # Issue 33: mode 0666 let any process that could reach /run/stallscope connect.
    need_root()
    plain = agent_factory()
    grouped = agent_factory("--socket-group", "65534")  # nobody's group: "the trainers'"
    for agent, mode, gid, answer in ((plain, 0o660, 0, "refused"), (grouped, 0o660, 65534, "connected")):
        st = os.stat(agent.socket)
        assert (st.st_mode & 0o777, st.st_gid) == (mode, gid)
        out = subprocess.run(as_nobody([sys.executable, "-c", CONNECT, agent.socket]),
                             capture_output=True, text=True, timeout=60, env=child_env())
        assert out.stdout.strip() == answer, out.stderr
    s = connect(plain.socket)  # the agent's own user (root here) may
    s.send(report(pod="root-trainer", events=[batch(0.001, 0.01)]))
    wait_until(lambda: samples(plain, "stallscope_data_wait_seconds_count", pod="root-trainer") == [1])
    s.close()
