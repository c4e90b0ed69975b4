"""The scale rig's processes: synthetic agents, and either one Prometheus (path A, the
default deployment) or two vmagent members sharding the targets, remote-writing into
victoria-metrics, with vmalert evaluating the generated rules (path B, deploy/victoriametrics).
Each runs from the Debian packages (scripts/install-system-deps) on 127.0.0.1 with its
own data directory under the run directory, and is stopped by the rig (by its PID)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RULE_FILES = [os.path.join(ROOT, "alerts", "rules.yaml"), os.path.join(ROOT, "alerts", "alerts.yaml")]
SCRAPE_INTERVAL = 15
EVAL_INTERVAL = 15
AGENTS_PORT = 19100
PROM_PORT = 19090
VM_PORT = 18428
VMAGENT_PORT = 18429  # member i listens on VMAGENT_PORT + i
VMALERT_PORT = 18880


def nice_15():
    os.nice(max(0, 15 - os.nice(0)))


class Proc:
    def __init__(self, name, args, rundir, env=None):
        self.name = name
        self.log = open(os.path.join(rundir, name + ".log"), "w")
        # Niceness 15, not 15 more than the rig's (run under `nice -n 15` as this shared
        # machine asks, it would be 19 and lose to every other engineer's nice-15 tests):
        # every server at the same priority, so the ratios between them hold.
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True, preexec_fn=nice_15)

    def rss_bytes(self):
        """Resident set of the server process (the nice wrapper execs it: same PID)."""
        try:
            with open("/proc/%d/status" % self.p.pid) as f:
                return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024
        except (OSError, AttributeError):
            return None

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def get(url, timeout=60):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:  # the server's reason, not just its status
        reason = e.read()[-600:].decode(errors="replace")  # the end says why
        raise RuntimeError("%s: %s %s" % (url[:200], e.code, reason)) from None


def wait_http(url, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            get(url, timeout=2)
            return
        except (OSError, RuntimeError):  # not listening yet, or 503 while starting
            time.sleep(0.5)
    raise RuntimeError("%s did not answer within %ds" % (url, seconds))


def scrape_config(nodes, path, prometheus=False):
    """One scrape job over every node's agent, the shape of deploy/victoriametrics's: with
    honor_labels, since the agent's series carry the training job's `job` label."""
    targets = [{"targets": ["127.0.0.1:%d" % AGENTS_PORT],
                "labels": {"__metrics_path__": "/node/%d/metrics" % i,
                           "instance": "127.0.0.1:%d/node/%d" % (AGENTS_PORT, i)}} for i in range(nodes)]
    timeout = min(max(10, SCRAPE_INTERVAL * 2 // 3), 30)  # 10 s at the default 15 s
    cfg = {"global": {"scrape_interval": "%ds" % SCRAPE_INTERVAL, "scrape_timeout": "%ds" % timeout},
           "scrape_configs": [{"job_name": "stallscope", "honor_labels": True, "static_configs": targets}]}
    if prometheus:  # vmagent refuses what it does not use
        cfg["global"]["evaluation_interval"] = "%ds" % EVAL_INTERVAL
    with open(path, "w") as f:
        json.dump(cfg, f)  # YAML is a superset of JSON
    return path


def rig_rules(rundir, for_duration):
    """The generated rule files with every `for:` set to ``for_duration`` (the rig cannot
    wait 15 minutes per size; the delay beyond `for:` is what it measures)."""
    out = []
    for src in RULE_FILES:
        dst = os.path.join(rundir, os.path.basename(src))
        with open(src) as f:
            text = re.sub(r"(?m)^(\s+for: )\S+$", r"\g<1>" + for_duration, f.read())
        with open(dst, "w") as f:
            f.write(text)
        out.append(dst)
    return out


def start_agents(nodes, rundir, procs, count=2):
    """``count`` serving processes on one port (SO_REUSEPORT): the kernel spreads the scrapes."""
    control = os.path.join(rundir, "straggler.json")
    for i in range(count):
        procs["agents-%d" % i] = Proc("agents-%d" % i, [
            sys.executable, os.path.join(HERE, "agents.py"), "--nodes", str(nodes),
            "--port", str(AGENTS_PORT), "--control", control], rundir)
    wait_http("http://127.0.0.1:%d/node/0/metrics" % AGENTS_PORT)
    return control


def start_prometheus(nodes, rundir, rules, procs):
    cfg = scrape_config(nodes, os.path.join(rundir, "prometheus.yml"), prometheus=True)
    with open(cfg) as f:
        c = json.load(f)
    c["rule_files"] = rules
    with open(cfg, "w") as f:
        json.dump(c, f)
    procs["prometheus"] = Proc("prometheus", [
        "prometheus", "--config.file", cfg, "--storage.tsdb.path", os.path.join(rundir, "prom"),
        "--web.listen-address", "127.0.0.1:%d" % PROM_PORT, "--storage.tsdb.retention.time", "1d"],
             rundir)
    url = "http://127.0.0.1:%d" % PROM_PORT
    wait_http(url + "/-/ready")
    return ["prometheus"], url


def start_victoriametrics(nodes, rundir, rules, procs, members=2):
    cfg = scrape_config(nodes, os.path.join(rundir, "vmagent.yml"))
    url = "http://127.0.0.1:%d" % VM_PORT
    procs["victoria-metrics"] = Proc("victoria-metrics", [
        "victoria-metrics", "-storageDataPath", os.path.join(rundir, "vm"), "-retentionPeriod", "1d",
        "-httpListenAddr", "127.0.0.1:%d" % VM_PORT, "-search.latencyOffset", "5s",
        # 2 cores allow 4 concurrent queries: queue the rig's and vmalert's rather than
        # refuse them after 10 s (503) while the machine is loaded
        "-search.maxQueueDuration", "60s"], rundir)
    wait_http(url + "/health")
    for i in range(members):
        procs["vmagent-%d" % i] = Proc("vmagent-%d" % i, [
            "vmagent", "-promscrape.config", cfg, "-remoteWrite.url", url + "/api/v1/write",
            "-remoteWrite.tmpDataPath", os.path.join(rundir, "vmagent-%d" % i),
            "-promscrape.cluster.membersCount", str(members), "-promscrape.cluster.memberNum", str(i),
            "-httpListenAddr", "127.0.0.1:%d" % (VMAGENT_PORT + i)], rundir)
    procs["vmalert"] = Proc("vmalert", [
        "vmalert", *["-rule=" + r for r in rules], "-datasource.url", url, "-remoteWrite.url", url,
        "-evaluationInterval", "%ds" % EVAL_INTERVAL, "-notifier.url", "http://127.0.0.1:9/",
        # query at the evaluation's own time: aligned (the default), the time is truncated
        # to a multiple of the interval, up to an interval in the past (VictoriaMetrics
        # PR 1257): the alert read data up to 60 s old at a 60 s interval
        "-datasource.queryTimeAlignment=false",
        "-httpListenAddr", "127.0.0.1:%d" % VMALERT_PORT], rundir)
    for i in range(members):
        wait_http("http://127.0.0.1:%d/health" % (VMAGENT_PORT + i))
    wait_http("http://127.0.0.1:%d/health" % VMALERT_PORT)
    return ["victoria-metrics"] + ["vmagent-%d" % i for i in range(members)] + ["vmalert"], url


def stop_all(procs, rundir=None, keep=False):
    for p in procs:
        p.stop()
    if rundir and not keep:
        shutil.rmtree(rundir, ignore_errors=True)
