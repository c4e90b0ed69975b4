"""loaderstate (exporters/loaderstate.py, system/taskstate.py): what the loader workers
are doing, sampled from procfs with only the two public lines in the trainer (issue 30).
Three real DataLoaders at once under one real agent: workers reading with plain
open()/read() from a slow FUSE mount (stallscope.lab.slowfs), workers burning CPU, and
workers with nothing to do; each split is checked against what was injected, and the
CPU share against the kernel's own record of the workers' CPU time."""
import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stallscope.lab import slowfs
from stallscope.processes.servers import AgentProcess, child_env
from stallscope.system import taskstate
from tests.helpers import ROOT
from tests.helpers.needs import need_fuse

TRAINER = os.path.join(ROOT, "tests", "helpers", "trainers", "state_trainer.py")
READ_LATENCY = 0.05   # seconds a FUSE read takes: ~all of a reading worker's time


def test_syscall_lines_parse_as_the_kernel_writes_them():
    read = taskstate.parse_syscall("0 0x5 0x7f12 0x10000 0x0 0x0 0x0 0x7ffd 0x7f00\n")
    assert read.kind == "read" and read.first_arg == 5 and not read.running
    assert taskstate.parse_syscall("running\n").running
    assert taskstate.parse_syscall("-1 0x7ffd 0x7f00\n").blocked_outside
    for junk in ("", "x y", None):
        assert taskstate.parse_syscall(junk) is None


def test_states_follow_the_call_and_its_descriptor():
    call = taskstate.Syscall
    assert taskstate.classify("worker", "S", call("read", 5, False, False), "/data/x", False) == "storage"
    assert taskstate.classify("worker", "S", call("read", 5, False, False), "pipe:[12]", False) == "idle"
    assert taskstate.classify("worker", "S", call("poll", 5, False, False), None, False) == "idle"
    assert taskstate.classify("worker", "S", call("recv", 5, False, False), "socket:[9]", False) == "network"
    assert taskstate.classify("main", "S", call("recv", 5, False, False), "socket:[9]", True) == "handoff"
    assert taskstate.classify("worker", "S", call("sleep", 0, False, False), None, False) == "sleeping"
    assert taskstate.classify("worker", "D", call(None, None, True, False), None, False) == "storage"
    assert taskstate.classify("worker", "S", call("futex", 0, False, False), None, False) == "other"
    assert [taskstate.mount_kind(t) for t in ("fuse.s3fs", "nfs4", "tmpfs", "overlay", "xfs")] == [
        "fuse", "network_fs", "tmpfs", "overlay", "local"]


def cpu_seconds(pids):
    total = 0.0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@pytest.mark.slow
def test_reading_busy_and_idle_workers_are_told_apart(tmp_path):
    pytest.importorskip("torch")
    need_fuse()
    slowfs.ensure_fusectl()
    fs = slowfs.SlowFS(str(tmp_path / "mnt"), latency=READ_LATENCY, private=True).start()
    agent = AgentProcess(["--exporter.loaderstate", "--exporter.loaderstate.window", "6"],
                         workdir=str(tmp_path)).start()
    trainers = []
    try:
        env = child_env({"STALLSCOPE_SOCKET": agent.socket})
        for mode in ("read", "busy", "idle"):
            cmd = [sys.executable, TRAINER, mode] + ([fs.mountpoint] if mode == "read" else []) + ["11"]
            e = dict(env, POD_NAME="state-%s" % mode, POD_NAMESPACE="ml")
            trainers.append(fs.popen(cmd, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        time.sleep(4)  # the workers started and at work
        ranks = {r["job"]: r for r in agent.api("/api/v1/ranks")["ranks"]}
        busy_pids = ranks["state-busy"]["worker_pids"]
        before, t0 = cpu_seconds(busy_pids), time.monotonic()
        time.sleep(6)  # one window of samples (--exporter.loaderstate.window), all before the loops end
        ranks = {r["job"]: r for r in agent.api("/api/v1/ranks")["ranks"]}
        kernel_cpu = (cpu_seconds(busy_pids) - before) / (time.monotonic() - t0) / len(busy_pids)
        metrics = agent.metrics()
        for t in trainers:
            assert t.stdout.readline().strip() == "done"
    finally:
        for t in trainers:
            if t.stdin:
                t.stdin.close()
            t.wait(timeout=30)
        agent.stop()
        fs.stop()
    split = {job: r["loader_state"]["worker"] for job, r in ranks.items()}
    print(json.dumps(split, indent=1))
    reading, busy, idle = split["state-read"], split["state-busy"], split["state-idle"]
    # blocked in read() on the FUSE mount for nearly all of each sample's READ_LATENCY
    assert reading["shares"].get("storage", 0) > 0.6, reading
    # slowfs answers every operation after READ_LATENCY: the reads are on the mount, the
    # opens and the closes' flushes (whose path the sampler never reads) unattributed,
    # nothing elsewhere: a third on the mount. 2 workers looked at 2.5 times a second over
    # the 6 s window are ~30 looks, a sampling error of ~0.09: 0.13 is over 2 of it below
    mounts = reading["storage_by_mount"]
    assert set(mounts) <= {"fuse:" + fs.mountpoint, "unattributed"}, reading
    assert mounts["fuse:" + fs.mountpoint] > 0.13, reading
    # on the CPU or waiting for it (2 cores, 6 workers): as much as the kernel counted
    cpu = busy["shares"].get("on_cpu", 0)
    assert cpu + busy["shares"].get("cpu_wait", 0) > 0.7, busy
    assert abs(cpu - kernel_cpu) < 0.15, (cpu, kernel_cpu)
    # nothing to do: waiting on the index queue
    assert idle["shares"].get("idle", 0) > 0.7, idle
    assert 'stallscope_loader_worker_time_ratio{' in metrics and 'state="storage"' in metrics


def switches(pid):
    with open("/proc/%d/status" % pid) as f:
        return {k: int(v) for k, v in (line.split(":") for line in f) if k.endswith("ctxt_switches")}


def test_sampling_never_wakes_or_stops_what_it_samples():
    """Two processes blocked in read() on a pipe, one sampled at 10 Hz for 2 s: neither
    is woken (no context switch, voluntary or not) and neither is stopped; the kernel's
    own counters in status say so."""
    from stallscope.exporters.loaderstate import LoaderStateExporter
    from tests.helpers.exporters import context, table_with

    r, w = os.pipe()
    code = "import os; os.read(%d, 1)" % r
    sampled, alone = (subprocess.Popen([sys.executable, "-c", code], pass_fds=(r,)) for _ in range(2))
    try:
        time.sleep(0.5)  # both blocked in the read
        before = {p.pid: switches(p.pid) for p in (sampled, alone)}
        exp = LoaderStateExporter(context(table_with(dict(pid=sampled.pid))))
        for _ in range(20):
            exp.sample_once()
            time.sleep(0.1)
        after = {p.pid: switches(p.pid) for p in (sampled, alone)}
        assert after == before, (before, after)
        with open("/proc/%d/stat" % sampled.pid) as f:
            assert f.read().rpartition(")")[2].split()[0] == "S"  # asleep, not stopped (T/t)
        assert exp.split(exp.ranks[0].key)["main"].shares()["idle"] > 0.9
    finally:
        for p in (sampled, alone):
            p.kill()
            p.wait()
        os.close(r)
        os.close(w)


def test_a_poll_on_a_connection_is_network_and_on_a_pipe_idle():
    """Python polls a socket that has a timeout before each recv (urllib, requests, the
    cloud SDKs): a process waiting for a server that has not answered is in poll() with
    a TCP connection open, and is network; one in multiprocessing's Queue.get(timeout)
    polls its pipe, and is idle (issue 31)."""
    import socket

    from stallscope.exporters.loaderstate import LoaderStateExporter
    from tests.helpers.exporters import context, table_with

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    fetch = ("import socket; s = socket.create_connection(('127.0.0.1', %d), timeout=30); "
             "s.sendall(b'GET / HTTP/1.1\\r\\n\\r\\n'); s.recv(1)" % srv.getsockname()[1])
    queue = "import multiprocessing as mp; q = mp.Queue(); q.get(timeout=30)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (fetch, queue)]
    conn = None
    try:
        conn, _ = srv.accept()  # accepted, never answered
        time.sleep(1.0)  # both blocked in their poll
        exp = LoaderStateExporter(context(table_with(dict(pid=procs[0].pid), dict(pid=procs[1].pid))))
        states = [exp._off_cpu("worker", p.pid, p.pid)[0] for p in procs]
        assert states == ["network", "idle"], states
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if conn is not None:
            conn.close()
        srv.close()


def test_a_worker_that_starts_fetching_is_network_while_its_loop_waits(monkeypatch):
    """A worker reading through a cache polls its index queue between misses and opens a
    connection only on a miss: found idle first, it must not read as idle for
    NO_INTERNET_S once it fetches while its rank's loop waits (issue 49: a drawn
    cache-miss run's workers read 99 % idle while the loop waited 16 % of its step) —
    nor for as long as the fetch hangs, when it begins right after a listing and the
    server never answers: the worker never runs again to be looked at."""
    import socket

    from stallscope.exporters import loaderstate
    from stallscope.exporters.loaderstate import LoaderStateExporter
    from tests.helpers.exporters import context, table_with

    monkeypatch.setattr(loaderstate, "FD_CACHE_S", 0.5)  # the re-check, scaled down
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    # the child polls a pipe (as a worker polls its index queue) until told to fetch, so
    # it is found idle however long its start takes on a loaded machine (CI once found it
    # still importing, "other", and past a fixed 1.5 s wait already fetching)
    code = ("import select, socket, sys\n"
            "select.select([sys.stdin], [], [], 60); sys.stdin.readline()  # a hit's wait\n"
            "s = socket.create_connection(('127.0.0.1', %d), timeout=30); s.recv(1)  # a miss\n"
            ) % srv.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    conn = None
    try:
        exp = LoaderStateExporter(context(table_with(dict(pid=os.getpid(), worker_pids=[proc.pid]))))
        seen = []
        told = None
        deadline = time.monotonic() + 25.0
        while time.monotonic() < deadline and "network" not in seen:
            exp.sample_once()
            task = exp.task.get((proc.pid, proc.pid))
            if task is not None and task.state is not None and task.state[0] not in seen[-1:]:
                seen.append(task.state[0])
            if "idle" in seen and told is None:
                proc.stdin.write(b"fetch\n")
                proc.stdin.flush()
                told = time.monotonic()
            if told is not None and conn is None:
                srv.settimeout(0.05)
                try:
                    conn, _ = srv.accept()  # accepted, never answered
                except OSError:
                    pass
            time.sleep(0.05)
        assert "idle" in seen, seen
        # NO_INTERNET_S (30 s) would have held it idle past the deadline: it is read as
        # network within a few FD_CACHE_S (0.5 s here) of the fetch
        assert "network" in seen[seen.index("idle"):], seen
        assert time.monotonic() - told < 10.0, (seen, time.monotonic() - told)
    finally:
        proc.kill()
        proc.wait()
        if conn is not None:
            conn.close()
        srv.close()


def test_a_worker_fetching_misses_between_polls_of_its_queue_is_network_while_it_fetches():
    """A worker reading through a cache polls its index queue (a pipe) between misses and
    opens a connection for each miss, answered 250 ms later: two different polls. One
    listing of its sockets, made while it polled the queue, read every miss of the next
    FD_CACHE_S (5 s, as deployed) as idle (issue 49, draw 413 cache_miss: 4 workers
    fetching 200 ms misses read 99 % idle while the loop waited); each poll has its own
    listing, so the fetches are network for the time they take."""
    import socket
    import threading

    from stallscope.exporters.loaderstate import LoaderStateExporter
    from tests.helpers.exporters import context, table_with

    answer_s, queue_s = 0.25, 0.15
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.recv(1)
                time.sleep(answer_s)  # a miss's round trip
                conn.sendall(b"y")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    code = ("import select, socket, sys\n"
            "select.select([sys.stdin], [], [], 60); sys.stdin.readline()\n"
            "while True:\n"
            "    select.select([sys.stdin], [], [], %r)  # the index queue between misses\n"
            "    s = socket.create_connection(('127.0.0.1', %d), timeout=30)\n"
            "    s.sendall(b'x'); s.recv(1); s.close()  # a miss\n"
            ) % (queue_s, srv.getsockname()[1])
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        table = table_with(dict(pid=os.getpid(), worker_pids=[proc.pid]))
        exp = LoaderStateExporter(context(table))
        exp.options = dataclasses.replace(exp.options, window=60.0)
        told = None
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and (told is None or time.monotonic() - told < 5.0):
            exp.sample_once()
            task = exp.task.get((proc.pid, proc.pid))
            if told is None and task is not None and task.state is not None and task.state[0] == "idle":
                proc.stdin.write(b"fetch\n")  # listed while it polled its queue: no socket
                proc.stdin.flush()
                told = time.monotonic()
            time.sleep(0.05)
        assert told is not None, "never found polling its queue"
        [rank] = table.snapshot()
        shares = exp.split(rank.key, seconds=4.0)["worker"].shares()
    finally:
        proc.kill()
        proc.wait()
        stop.set()
        server.join()
        srv.close()
    fetching = answer_s / (answer_s + queue_s)  # 0.62, less the connection's set-up
    # ~70 looks a run: the share's sampling error is near 0.06; 0.2 is over 3 of it
    assert abs(shares.get("network", 0.0) - fetching) < 0.2, shares
    assert abs(shares.get("idle", 0.0) - (1 - fetching)) < 0.2, shares


def test_a_worker_s_inherited_connections_are_its_training_process_s():
    """A loader worker forked after the process group started holds the training
    process's TCP connections (gloo's pairs): polling its index queue it is idle, not
    network (issue 30: every idle worker of a multi-rank lab job read as network), as is
    the training process polling its result queue; a worker that opened a connection of
    its own and polls it is network."""
    import socket

    from stallscope.exporters.loaderstate import LoaderStateExporter
    from tests.helpers.exporters import context, table_with

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    code = ("import multiprocessing as mp, os, socket, time\n"
            "group = socket.create_connection(('127.0.0.1', %d))  # the process group's\n"
            "q = mp.Queue()\n"
            "idle = os.fork()\n"
            "if idle == 0:\n    q.get(timeout=30); os._exit(0)\n"
            "fetching = os.fork()\n"
            "if fetching == 0:\n"
            "    s = socket.create_connection(('127.0.0.1', %d), timeout=30); s.recv(1); os._exit(0)\n"
            "print(idle, fetching, flush=True)\n"
            "mp.Queue().get(timeout=30)  # the result queue\n") % ((srv.getsockname()[1],) * 2)
    main = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    conns, children = [], []
    try:
        idle, fetching = children = [int(x) for x in main.stdout.readline().split()]
        conns = [srv.accept()[0] for _ in range(2)]  # accepted, never answered
        time.sleep(1.0)  # both children blocked in their poll
        table = table_with(dict(pid=main.pid, worker_pids=[idle, fetching]))
        exp = LoaderStateExporter(context(table))
        assert exp._off_cpu("worker", idle, idle, main.pid)[0] == "idle"
        assert exp._off_cpu("worker", fetching, fetching, main.pid)[0] == "network"
        assert exp._off_cpu("main", main.pid, main.pid, idle)[0] == "idle"
        # what tells them apart: both hold an internet socket, the process group's
        exp.internet.clear()
        assert exp._off_cpu("worker", idle, idle)[0] == "network"
        assert exp._off_cpu("main", main.pid, main.pid)[0] == "network"
        # and the sampler's own looks pass each worker's training process
        exp.internet.clear()
        looked = {}
        for _ in range(80):  # every task at every round; a new one's first look has no interval
            exp.sample_once()
            looked = {pid: task.state[0] for (pid, _), task in exp.task.items() if task.state}
            if {idle, fetching, main.pid} <= set(looked):
                break
            time.sleep(0.02)
        assert looked.get(idle) == "idle" and looked.get(fetching) == "network", looked
        assert looked.get(main.pid) == "idle", looked
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        main.kill()
        main.wait()
        for c in conns:
            c.close()
        srv.close()


def test_a_worker_pid_the_agent_did_not_accept_is_never_sampled():
    """A report from a rank's main process (the kernel names the sender) naming a worker
    that does not descend from it (another pod's process): the table refuses it, and the
    sampler reads only what the table accepted."""
    from stallscope.agent.identity import peer
    from stallscope.agent.table import state
    from stallscope.exporters.loaderstate import LoaderStateExporter
    from tests.helpers.exporters import context, rank_message

    main, stranger = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    try:
        table = state.RankTable(node="n1")
        source = peer.of_peer("/proc", main.pid, os.getuid())
        table.apply(rank_message(main.pid, worker_pids=[stranger.pid]), source)
        assert table.snapshot()[0].worker_pids == [] and table.refused_worker_pids == 1
        exp = LoaderStateExporter(context(table))
        exp.sample_once()
        sampled = {pid for (pid, _), task in exp.task.items() if task.looks}
        assert sampled == {main.pid}, sampled
    finally:
        for p in (main, stranger):
            p.kill()
            p.wait()


@pytest.mark.slow
def test_workers_looked_at_at_random_gaps_keep_their_shares():
    """Every worker is looked at every round, the rounds at gaps drawn at random whatever
    they find, and keeps each state's share of its time (a gap that grew while looks
    agreed aliased with periodic workers: 44 % idle for 30 % in
    benchmarks/bench_loaderstate.py --moving). Real processes at the sampler's own gaps,
    the workers of one rank: one blocked in read() on a pipe all along; 32 alternating a
    37 ms sleep and a 16 ms select() on a pipe (idle): 70 % sleeping."""
    from stallscope.exporters.loaderstate import GAP_HI, GAP_LO, LoaderStateExporter
    from tests.helpers.exporters import context, table_with

    r, w = os.pipe()
    alternate = ("import select, time\nwhile True:\n    time.sleep(0.037)\n"
                 "    select.select([%d], [], [], 0.016)" % r)
    trainer = ("import subprocess, sys, time\n"
               "ps = [subprocess.Popen([sys.executable, '-c', c], pass_fds=(%d,)) for c in sys.argv[1:]]\n"
               "print(' '.join(str(p.pid) for p in ps), flush=True)\ntime.sleep(60)" % r)
    main = subprocess.Popen([sys.executable, "-c", trainer, "import os; os.read(%d, 1)" % r]
                            + [alternate] * 32, pass_fds=(r,), stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in main.stdout.readline().split()]
    steady = pids[0]
    try:
        time.sleep(1.0)
        table = table_with(dict(pid=main.pid, worker_pids=pids))
        exp = LoaderStateExporter(context(table), None)
        exp.options = dataclasses.replace(exp.options, window=60.0)
        rounds, gaps = 0, []
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end:
            exp.sample_once()
            rounds += 1
            gaps.append(exp.gap())
            time.sleep(gaps[-1])
        looks = collections.Counter({pid: task.looks for (pid, _), task in exp.task.items()})
        [rank] = table.snapshot()
        assert rank.worker_pids == pids
        shares = exp.split(rank.key)["worker"].shares()
    finally:
        for pid in pids + [main.pid]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        main.wait()
        os.close(r)
        os.close(w)
    # the rank's workers together: 1 idle all along, 32 at 70 % sleeping and 30 % idle
    sleeping, idle = 32 * 0.70 / 33, (1 + 32 * 0.30) / 33
    print(rounds, looks[steady], shares)
    # every worker at every round, steady or moving
    assert all(looks[p] == rounds for p in pids), (looks, rounds)
    # the gaps spread over their range, not a grid: a periodic worker is met at every phase
    period = 1 / exp.options.rate
    assert all(GAP_LO * period <= g <= GAP_HI * period for g in gaps), gaps
    assert max(gaps) - min(gaps) > 0.5 * (GAP_HI - GAP_LO) * period, gaps
    # ~32 x 15 looks put the shares' sampling error near 0.02: 0.05 is over 2.5 of it
    assert abs(shares["sleeping"] - sleeping) < 0.05 and abs(shares["idle"] - idle) < 0.05, shares


def test_a_socket_is_told_by_its_protocol_not_by_the_namespace_s_unix_list():
    """A descriptor's socket kind from its inode's sockprotoname: a process holding unix
    and netlink sockets holds no internet one (its poll is idle); one with a TCP socket
    does (its poll is network)."""
    import socket

    code = ("import socket, sys, time\n"
            "keep = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)]\n"
            "if sys.argv[1] == 'tcp':\n    keep.append(socket.socket())\n"
            "print(' '.join(str(s.fileno()) for s in keep), flush=True)\ntime.sleep(30)")
    procs = [subprocess.Popen([sys.executable, "-c", code, kind], stdout=subprocess.PIPE, text=True)
             for kind in ("local", "tcp")]
    try:
        fds = [[int(x) for x in p.stdout.readline().split()] for p in procs]
        local, tcp = procs
        assert taskstate.is_unix(taskstate.socket_protocol("/proc", local.pid, fds[0][0]))
        assert taskstate.socket_protocol("/proc", local.pid, fds[0][1]) == "NETLINK"
        assert taskstate.socket_protocol("/proc", tcp.pid, fds[1][2]) == "TCP"
        assert taskstate.socket_protocol("/proc", local.pid, 0) is None  # a pipe, not a socket
        assert not taskstate.holds_internet_socket("/proc", local.pid)
        assert taskstate.holds_internet_socket("/proc", tcp.pid)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    with socket.socket() as s:  # ours too: the attribute is the socket's, read through the link
        assert taskstate.socket_protocol("/proc", os.getpid(), s.fileno()) == "TCP"
