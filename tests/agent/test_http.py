"""The agent's HTTP server (stallscope/agent/web/http.py, httpserver.py, httpwire.py) on
127.0.0.1 with real sockets: what a node daemon must do (node_exporter and the kubelet
are the bar) and what a hostile or broken client must not achieve."""
import http.client
import json
import os
import select
import socket
import threading
import time

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.agent.web import http as agent_http
from stallscope.agent.web.exposition import Exposition

READ_TIMEOUT, IDLE_TIMEOUT = 1.0, 1.5


def exposition(ranks=64):
    g = GaugeMetricFamily("t_wait_ratio", "A gauge per rank.", labels=["job", "rank"])
    for r in range(ranks):
        g.add_metric(["j", str(r)], r / 100)
    return Exposition().render([g])


class Served:
    def __init__(self, render=None, routes=None, **limits):
        self.renders = 0
        self.render_delay = 0.0
        self.body = exposition()

        def default_render():
            self.renders += 1
            time.sleep(self.render_delay)
            return self.body
        limits = {"read_timeout": READ_TIMEOUT, "idle_timeout": IDLE_TIMEOUT, **limits}
        self.server = agent_http.make_server("127.0.0.1:0", render or default_render,
                                             routes or {"/api/v1/x": lambda q: (200, {"q": q}),
                                                        "/api/v1/bug": lambda q: 1 / 0},
                                             lambda: (True, "ok"), **limits)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="stallscope-http")
        self.thread.start()

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def get(self, path, method="GET"):
        c = self.conn()
        c.request(method, path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r, body

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def served():
    made = []

    def make(**kw):
        made.append(Served(**kw))
        return made[-1]
    yield make
    for s in made:
        s.stop()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("stallscope-http")]


def raw(port, data, timeout=5.0):
    """Send ``data``, read until the server closes; (bytes, seconds until closed)."""
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    s.sendall(data)
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    finally:
        s.close()
    return out, time.monotonic() - t0


def status_of(response):
    return int(response.split(b" ", 2)[1])


def head_fields(response):
    head = response.split(b"\r\n\r\n", 1)[0].decode()
    return {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:])}


def threads():
    return len(os.listdir("/proc/self/task"))


def test_head_is_served_for_every_get_route_with_its_length_and_no_body(served):
    s = served()
    for path in ("/metrics", "/healthz", "/api/v1/x?a=1", "/api/v1/nothing"):
        got, body = s.get(path)
        answer, _ = raw(s.port, b"HEAD %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert status_of(answer) == got.status, path
        fields = head_fields(answer)
        assert int(fields["content-length"]) == len(body) > 0, path
        assert fields["content-type"] == got.getheader("Content-Type"), path
        assert rest == b"", path  # no body, and nothing after it


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_get_405_with_allow(served, method):
    s = served()
    r, body = s.get("/metrics", method)
    assert r.status == 405
    assert r.getheader("Allow") == "GET, HEAD"
    assert "not allowed" in json.loads(body)["error"]
    assert s.renders == 0


def test_a_post_with_a_body_gets_its_405_whole(served):
    s = served()
    answer, _ = raw(s.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
    assert status_of(answer) == 405 and answer.endswith(b"\n")
    assert int(head_fields(answer)["content-length"]) == len(answer.split(b"\r\n\r\n", 1)[1])


def test_a_thousand_idle_connections_hold_no_thread_and_a_scrape_still_succeeds(served):
    s = served(max_connections=256)
    s.get("/metrics")  # the pool is up
    before = threads()
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(1000)]
    try:
        deadline = time.monotonic() + 10
        while s.server.stats.dropped["evicted"] < 1000 - 256 and time.monotonic() < deadline:
            time.sleep(0.05)
        during = threads()
        assert s.server.stats.dropped["evicted"] >= 1000 - 256
        assert s.server.stats.open <= 256
        assert during <= before, "the server started threads for idle connections"
        r, body = s.get("/metrics")
        assert r.status == 200 and body == s.body
    finally:
        for c in idle:
            c.close()


def test_slow_loris_is_closed_after_the_read_timeout(served):
    s = served()
    c = socket.create_connection(("127.0.0.1", s.port))
    c.settimeout(READ_TIMEOUT + 3)
    t0 = time.monotonic()
    c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    while time.monotonic() - t0 < READ_TIMEOUT + 3:  # a byte every 0.2 s: the deadline stays
        try:
            c.sendall(b"X")
        except OSError:
            break
        if select.select([c], [], [], 0.2)[0]:
            break
    took = time.monotonic() - t0
    got = b""
    while chunk := c.recv(65536):
        got += chunk
    c.close()
    assert status_of(got) == 408
    assert READ_TIMEOUT - 0.05 <= took < READ_TIMEOUT + 1.0, took
    assert s.server.stats.dropped["timeout"] == 1


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(served):
    s = served()
    c = socket.create_connection(("127.0.0.1", s.port))
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    c.settimeout(10)
    assert c.recv(65536).endswith(b"ok\n")
    t0 = time.monotonic()
    assert c.recv(65536) == b""  # closed by the server, without a word
    assert IDLE_TIMEOUT - 0.05 <= time.monotonic() - t0 < IDLE_TIMEOUT + 1.0
    c.close()
    assert s.server.stats.dropped["idle"] == 1


def test_limits_and_malformed_requests_get_their_status(served):
    s = served()
    cases = [
        (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 150 + b"\r\n", 431),
        (b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /metrics\r\n\r\n", 400),                     # HTTP/0.9
        (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
        (b"G(T /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\n folded: x\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET /metrics HTTP/one\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"GET /metrics HTTP/1.2\r\n\r\n", 505),
        (b"GET /metrics HTTP/0.9\r\n\r\n", 505),
        # RFC 9110 5.5: no NUL or other control bytes in a field value (issue 33)
        (b"GET /metrics HTTP/1.1\r\nX-Nul: a\x00b\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX-Ctl: a\x01b\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX-Esc: \x1b[2J\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX-Del: a\x7fb\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400),
    ]
    for request, status in cases:
        answer, _ = raw(s.port, request)
        assert status_of(answer) == status, request[:60]
        assert head_fields(answer)["connection"] == "close"
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"], request[:60]
    assert s.renders == 0


def test_keep_alive_serves_two_requests_on_one_connection_and_pipelined_ones(served):
    s = served()
    c = s.conn()
    c.request("GET", "/metrics")
    first = c.getresponse()
    assert first.read() == s.body and not first.will_close
    sock = c.sock
    c.request("GET", "/healthz")
    second = c.getresponse()
    assert second.read() == b"ok\n" and c.sock is sock  # the same connection
    c.close()
    answer, _ = raw(s.port, b"GET /healthz HTTP/1.1\r\n\r\nGET /api/v1/x?a=1 HTTP/1.1\r\n\r\n"
                            b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 3 and answer.endswith(b"ok\n")
    old, _ = raw(s.port, b"GET /healthz HTTP/1.0\r\n\r\n")  # 1.0 closes unless asked
    assert old.endswith(b"ok\n")


def test_fifty_concurrent_scrapers_get_valid_bytes_from_shared_renders(served):
    s = served()
    s.body = exposition(ranks=500)
    s.render_delay = 0.05  # long enough for the scrapes to overlap
    want = {(x.name, tuple(sorted(x.labels.items())), x.value)
            for f in text_string_to_metric_families(s.body.decode()) for x in f.samples}
    start = threading.Barrier(50)
    results = []

    def scrape():
        start.wait()
        r, body = s.get("/metrics")
        got = {(x.name, tuple(sorted(x.labels.items())), x.value)
               for f in text_string_to_metric_families(body.decode()) for x in f.samples}
        results.append((r.status, got == want, len(got)))
    pool = [threading.Thread(target=scrape) for _ in range(50)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(30)
    assert len(results) == 50
    assert all(r == (200, True, 500) for r in results), results[:3]
    assert s.renders < 25, "scrapes did not share renders: %d renders" % s.renders
    shared = s.renders
    s.render_delay = 0.0
    s.get("/metrics")
    s.get("/metrics")
    assert s.renders == shared + 2  # a scrape after a render finished gets a new one: no caching


def test_a_failing_route_or_render_is_a_500_naming_its_type(served):
    s = served()
    r, body = s.get("/api/v1/bug")
    assert r.status == 500 and json.loads(body) == {"error": "internal error: ZeroDivisionError"}
    broken = served(render=lambda: {}["missing"])
    r, body = broken.get("/metrics")
    assert r.status == 500 and json.loads(body) == {"error": "internal error: KeyError"}
    assert s.get("/healthz")[0].status == 200  # and the server goes on


def test_when_every_connection_is_busy_a_new_one_is_refused_with_503(served):
    started, release = threading.Event(), threading.Event()
    s = served(render=lambda: started.set() or release.wait(10) and b"a 1\n", max_connections=4)
    busy = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(4)]
    for c in busy:
        c.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    assert started.wait(5)
    deadline = time.monotonic() + 5
    while (s.server._waiting or s.server.stats.open < 4) and time.monotonic() < deadline:
        time.sleep(0.02)  # until all four are being answered: none of them can be evicted
    answer, _ = raw(s.port, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert status_of(answer) == 503 and s.server.stats.dropped["refused"] == 1
    release.set()
    for c in busy:
        c.settimeout(5)
        assert c.recv(65536).endswith(b"a 1\n")
        c.close()


def test_shutdown_is_prompt_and_leaves_no_thread(served):
    s = served()
    conns = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(20)]
    s.get("/metrics")
    running = {t.name for t in threading.enumerate()}
    assert {"stallscope-http-worker-%d" % i for i in range(4)} <= running
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 1.0
    assert not s.thread.is_alive()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("stallscope-http")]
    for c in conns:
        c.settimeout(2)
        assert c.recv(10) == b""  # closed
        c.close()


def test_the_agent_serves_and_exports_its_server_counters(tmp_path):
    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock"), listen="127.0.0.1:0"),
                         enabled={"gpu": False}))
    agent.start()
    try:
        url = ("127.0.0.1", agent.port)
        raw(agent.port, b"PUT /metrics HTTP/1.1\r\n\r\n")
        c = http.client.HTTPConnection(*url, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
                   for f in text_string_to_metric_families(text) for x in f.samples}
        assert samples[("stallscope_agent_http_requests_total", (("code", "4xx"),))] == 1
        assert samples[("stallscope_agent_http_connections", ())] >= 1
        assert ("stallscope_agent_http_connections_dropped_total", (("reason", "evicted"),)) in samples
    finally:
        agent.stop()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("stallscope-http")]


def test_health_and_metrics_answer_while_the_api_holds_every_worker_and_more_get_429(served):
    # Issue 33: /healthz and /metrics queued behind the JSON API on the same workers (p99
    # 14.6 s under 50 API clients at 256 ranks): the liveness probe failed a healthy agent.
    from stallscope.agent.web.http import MAX_API_IN_FLIGHT, RETRY_AFTER_S

    entered, release = threading.Semaphore(0), threading.Event()

    def slow(q):
        entered.release()
        release.wait(20)
        return 200, {"slow": True}
    s = served(routes={"/api/v1/slow": slow})
    held = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(MAX_API_IN_FLIGHT)]
    for c in held:
        c.sendall(b"GET /api/v1/slow HTTP/1.1\r\n\r\n")
    for _ in range(4):  # every worker of the pool is inside the slow route
        assert entered.acquire(timeout=5)
    try:
        deadline = time.monotonic() + 5
        while s.server._waiting and time.monotonic() < deadline:
            time.sleep(0.02)  # all of them read and dispatched (4 running, 4 queued)
        answer, took = raw(s.port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", timeout=3)
        assert status_of(answer) == 200 and answer.endswith(b"\r\n\r\nok\n") and took < 2
        answer, took = raw(s.port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", timeout=3)
        assert status_of(answer) == 200 and answer.endswith(s.body) and took < 2
        answer, _ = raw(s.port, b"GET /api/v1/slow HTTP/1.1\r\nConnection: close\r\n\r\n", timeout=3)
        assert status_of(answer) == 429
        assert head_fields(answer)["retry-after"] == str(RETRY_AFTER_S)
        assert "retry" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    finally:
        release.set()
    for c in held:  # the held ones are answered, and the API serves again after them
        c.settimeout(10)
        assert status_of(c.recv(65536)) == 200
        c.close()
    r, body = s.get("/api/v1/slow")
    assert r.status == 200 and json.loads(body) == {"slow": True}


def test_the_pool_s_stop_waits_its_timeout_in_all_not_per_thread():
    """Three workers each busy with a 3 s job at the stop: it waits the 1 s timeout once
    (its threads are daemons, ended with the process), not once per thread; an idle pool
    stops at once."""
    from stallscope.agent.web.httppool import Workers

    busy, release = Workers(3, "test-busy"), threading.Event()
    busy.start()
    started = threading.Semaphore(0)

    def job():
        started.release()
        release.wait(3.0)

    for _ in range(3):
        busy.submit(job)
    for _ in range(3):
        assert started.acquire(timeout=5)
    t = time.monotonic()
    busy.stop(timeout=1.0)
    took = time.monotonic() - t
    release.set()
    assert 0.9 <= took < 2.0, took  # 3 s with a timeout per thread
    idle = Workers(3, "test-idle")
    idle.start()
    t = time.monotonic()
    idle.stop(timeout=1.0)
    assert time.monotonic() - t < 0.5
