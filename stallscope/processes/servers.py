"""Servers as real processes, for the lab, ``stallscope run``, the demo and the tests: a
stallscope agent and a Prometheus server on 127.0.0.1, each on a free port, started in a
temporary directory and stopped cleanly.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from .children import child_env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _wait(pred, timeout, what, proc=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = open(log).read()[-2000:] if log else ""
            raise RuntimeError("%s exited with %s: %s" % (what, proc.returncode, tail))
        try:
            if pred():
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError("%s not ready after %.0fs" % (what, timeout))


class AgentProcess:
    """``python -m stallscope agent`` on a free port and a private socket."""

    def __init__(self, args=(), workdir=None, env=None, popen_kwargs=None, host="127.0.0.1", prefix=()):
        """``host``, ``prefix``: a lab node's address and the command that enters its
        namespaces (lab/nodes.py); the default is this machine's loopback."""
        self.dir = workdir or tempfile.mkdtemp(prefix="stallscope-agent-")
        self.popen_kwargs = popen_kwargs or {}  # e.g. the lab's own session + death signal
        self.socket = os.path.join(self.dir, "hook.sock")
        self.port = free_port()
        self.host, self.prefix = host, list(prefix)
        self.url = "http://%s:%d" % (host, self.port)
        self.log = os.path.join(self.dir, "agent.log")
        self.args = list(args)
        self.env = child_env(env)
        self.proc = self._logf = None

    def start(self, timeout=20.0):
        cmd = self.prefix + [sys.executable, "-m", "stallscope", "agent", "--listen",
                             "%s:%d" % (self.host, self.port), "--socket", self.socket] + self.args
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=self.env,
                                     **self.popen_kwargs)
        _wait(lambda: http_get(self.url + "/healthz", 1) == "ok\n", timeout, "agent", self.proc, self.log)
        return self

    def metrics(self):
        return http_get(self.url + "/metrics")

    def api(self, path):
        return json.loads(http_get(self.url + path))

    def stop(self, sig=None):
        killed = False
        if self.proc and self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                # what it was waiting on, into its log (the agent's SIGUSR1: faulthandler)
                self.proc.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
                self.proc.kill()
                self.proc.wait()
                killed = True
        if self._logf is not None:
            self._logf.close()
        if killed:
            with open(self.log, errors="replace") as f:
                tail = f.read()[-8000:]
            print("agent not gone 10 s after the signal, killed; its log ends:\n%s" % tail, file=sys.stderr)
        return self.proc.returncode if self.proc else None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class PrometheusProcess:
    """Debian's prometheus on 127.0.0.1 scraping ``targets`` every ``interval``.

    honor_labels is on: the agent's per-rank series carry the training job's `job`
    label, which must not be renamed to exported_job by the scrape.
    """

    def __init__(self, targets, rule_files=(), interval="1s", workdir=None, binary=None,
                 popen_kwargs=None):
        self.binary = binary or shutil.which("prometheus")
        self.popen_kwargs = popen_kwargs or {}
        self.dir = workdir or tempfile.mkdtemp(prefix="stallscope-prom-")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.targets = ["%s" % urllib.parse.urlsplit(t).netloc if "://" in t else t for t in targets]
        self.rule_files = [os.path.abspath(r) for r in rule_files]
        self.interval = interval
        self.log = os.path.join(self.dir, "prometheus.log")
        self.proc = self._logf = None

    def config(self):
        rules = "".join("  - %s\n" % r for r in self.rule_files)
        targets = ", ".join('"%s"' % t for t in self.targets)
        return (
            "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n"
            "rule_files:\n%s"
            "scrape_configs:\n  - job_name: stallscope\n    honor_labels: true\n"
            "    static_configs:\n      - targets: [%s]\n"
        ) % (self.interval, self.interval, rules or "  []\n", targets)

    def start(self, timeout=30.0):
        if not self.binary:
            raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
        cfg = os.path.join(self.dir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(self.config())
        cmd = [self.binary, "--config.file=" + cfg, "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
               "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn",
               "--web.enable-lifecycle"]
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._logf, stderr=subprocess.STDOUT,
                                     **self.popen_kwargs)
        _wait(lambda: "Ready" in http_get(self.url + "/-/ready", 1), timeout, "prometheus",
              self.proc, self.log)
        return self

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        body = json.loads(http_get(self.url + "/api/v1/query?" + urllib.parse.urlencode(params)))
        if body.get("status") != "success":
            raise RuntimeError("query %r failed: %s" % (expr, body))
        return body["data"]["result"]

    def query_range(self, expr, start, end, step):
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        body = json.loads(http_get(self.url + "/api/v1/query_range?" + urllib.parse.urlencode(params)))
        if body.get("status") != "success":
            raise RuntimeError("query %r failed: %s" % (expr, body))
        return body["data"]["result"]

    def alerts(self):
        return json.loads(http_get(self.url + "/api/v1/alerts"))["data"]["alerts"]

    def wait_for(self, expr, pred=bool, timeout=30.0):
        """Poll ``expr`` until ``pred(result)`` holds; returns the result."""
        deadline = time.monotonic() + timeout
        result = None
        while time.monotonic() < deadline:
            result = self.query(expr)
            if pred(result):
                return result
            time.sleep(0.5)
        raise TimeoutError("%r did not satisfy the condition in %.0fs; last: %s" % (expr, timeout, result))

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._logf is not None:
            self._logf.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
