"""The health responder (issue 50, agent/healthd.py): /healthz answered by a process of
the agent's own while the agent's interpreter lock is held, the agent's status and its
staleness, every other request handed to the agent unread, the loop taking over when
the responder dies, and its cost counted as the agent's. ~6 s."""
import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from stallscope.agent.api import CoreRoutes
from stallscope.agent.web import healthd
from stallscope.agent.web import http as agent_http

HOLD_S = 1.5

# One probe from a process of its own (as the kubelet's): a fresh connection, the time
# to its answer, asked LATE_S after it says it is ready. Printed as JSON: [status, body,
# seconds].
LATE_S = 0.3
PROBE = """
import http.client, json, sys, time
print("ready", flush=True)
time.sleep(0.3)
t = time.perf_counter()
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
c.request(sys.argv[2], "/healthz")
r = c.getresponse()
body = r.read().decode()
print(json.dumps([r.status, body, time.perf_counter() - t]))
"""


def serve(front, routes=None, healthy=lambda: (True, "ok")):
    srv = agent_http.make_server("127.0.0.1:0", lambda: b"m 1\n", routes or {}, healthy, front=front)
    if front:
        srv.health.write(*healthy())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def stop(srv):
    srv.shutdown()
    srv.server_close()


def get(port, path, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()


def probe_while_the_gil_is_held(port, method="GET"):
    """A probe from another process while this one holds its interpreter's lock for
    HOLD_S (a C call through ctypes.PyDLL keeps it): [status, body, seconds]."""
    p = subprocess.Popen([sys.executable, "-c", PROBE, str(port), method], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"  # its interpreter started, outside the hold
    ctypes.PyDLL(None).usleep(int(HOLD_S * 1e6))  # the GIL held throughout; asked LATE_S in
    out, _ = p.communicate(timeout=30)
    return json.loads(out)


@pytest.fixture
def front():
    srv = serve(True)
    deadline = time.monotonic() + 10
    while not healthd.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield srv
    stop(srv)


def test_health_is_answered_while_the_agent_holds_its_interpreter_lock(front):
    port = front.server_address[1]
    status, body, took = probe_while_the_gil_is_held(port)
    assert (status, body) == (200, "ok\n")
    # asked LATE_S into the hold, answered during it (the hold is HOLD_S - LATE_S more)
    assert took < 0.5, took
    status, body, _took = probe_while_the_gil_is_held(port, "HEAD")
    assert (status, body) == (200, "")


def test_without_the_responder_the_probe_waits_for_the_lock():
    srv = serve(False)
    try:
        status, body, took = probe_while_the_gil_is_held(srv.server_address[1])
    finally:
        stop(srv)
    assert (status, body) == (200, "ok\n")
    assert took >= HOLD_S - LATE_S - 0.3, took


def test_the_status_the_agent_writes_and_a_stale_one(front):
    port = front.server_address[1]
    front.health.write(False, "hook socket gone")
    assert get(port, "/healthz") == (503, "hook socket gone\n")
    # the jobs thread silent longer than STALE_S: 503, naming it
    front.health.write(True, "ok", time.monotonic_ns() - int((healthd.STALE_S + 5) * 1e9))
    status, body = get(port, "/healthz")
    assert status == 503 and "jobs thread has not run for 20 s" in body, body
    front.health.write(True, "ok")
    front.health.beat_loop(time.monotonic_ns() - int((healthd.STALE_S + 1) * 1e9))
    status, body = get(port, "/healthz")
    assert status == 503 and "HTTP loop has not run" in body, body
    # the loop stamps its turn when woken (the agent's beat job, each HEALTH_BEAT_S)
    front.beat()
    time.sleep(0.2)
    assert get(port, "/healthz") == (200, "ok\n")


def test_other_requests_go_to_the_agent_unread_and_keep_alive_stays_with_it():
    srv = serve(True, {"/api/v1/x": lambda q: (200, {"asked": sorted(q)})})
    try:
        port = srv.server_address[1]
        assert get(port, "/metrics") == (200, "m 1\n")
        assert get(port, "/api/v1/x?a=1") == (200, '{\n "asked": [\n  "a"\n ]\n}\n')
        assert get(port, "/healthzz")[0] == 404
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert get(port, "/api/v1/x", c)[0] == 200
        assert get(port, "/healthz", c) == (200, "ok\n")  # the agent's own answer, on its connection
        assert get(port, "/metrics", c) == (200, "m 1\n")
        # a request line that trickles in is handed over too, once it is not a health check
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GE")
        time.sleep(0.2)
        s.sendall(b"T /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
        s.close()
    finally:
        stop(srv)


def _cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_request_line_that_trickles_costs_the_responder_nothing_meanwhile(front):
    """Too few bytes yet to tell a health check ("GET /hea") stay unread in the socket:
    peeked at again every RECHECK_S, not at every turn of a selector that reports them
    ready (a spin: a core's worth for as long as the client waits), then answered."""
    (pid,) = healthd.running()
    before = _cpu_seconds(pid)
    s = socket.create_connection(("127.0.0.1", front.server_address[1]))
    s.sendall(b"GET /hea")
    time.sleep(0.6)
    s.sendall(b"lthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
    s.close()
    assert _cpu_seconds(pid) - before < 0.2


def test_the_loop_answers_when_the_responder_dies_and_its_cost_is_the_agents(front):
    port = front.server_address[1]
    (pid,) = healthd.running()
    cost = CoreRoutes(None, None).agent({})[1]
    mine = [t for t in cost["threads"] if t["name"] == "health responder (process)"]
    assert [t["native_id"] for t in mine] == [pid]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while healthd.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert healthd.running() == []
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/metrics") == (200, "m 1\n")


def test_a_stopped_server_leaves_no_responder():
    srv = serve(True)
    deadline = time.monotonic() + 10
    while not healthd.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert healthd.running()
    stop(srv)
    assert healthd.running() == []


def test_a_status_written_halfway_reads_as_the_last_whole_one():
    page = healthd.HealthPage.create()
    try:
        page.write(True, "ok")
        page.beat_loop()
        at = page.read()[0]
        # the writer stopped between its fields (waiting for the interpreter's lock):
        # its count odd, a new code and text half there
        page.seq += 1
        healthd.struct.pack_into("=Q", page.map, 0, page.seq)
        healthd.struct.pack_into("=II", page.map, healthd.CODE_AT, 503, 4)
        page.map[healthd.HEAD.size:healthd.HEAD.size + 4] = b"hook"
        assert healthd.answer(page, at) == (200, b"ok\n")
    finally:
        page.close()


def test_what_is_a_health_check():
    assert healthd.kind(b"GET /healthz HTTP/1.1") == "health"
    assert healthd.kind(b"HEAD /healthz?x") == "health"
    assert healthd.kind(b"GET /healthzz") == "other"
    assert healthd.kind(b"GET /metrics") == "other"
    assert healthd.kind(b"POST /healthz") == "other"
    assert healthd.kind(b"GET /heal") == "wait"
    assert healthd.kind(b"GET /healthz") == "wait"
