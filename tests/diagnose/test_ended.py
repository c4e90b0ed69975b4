"""`diagnose POD` just after its job ended (issue 52, item 1): Prometheus holds the job's
last minutes, a clear stall; the node's agent holds the rank as exited (its last 30 s)
or no longer tracks it. The report is of the pod's last 5 minutes, from Prometheus, and
says so first: not UNKNOWN, "check that the rank is alive". A real agent, and a real
Prometheus backfilled with the job's 10 minutes (promtool), its last batch 30 s ago:
5 minutes healthy, then 5 minutes waiting 40 % of each step, too_few_workers scored."""
import json
import subprocess
import sys
import time

import pytest

from stallscope.processes.children import child_env
from stallscope.processes.servers import AgentProcess
from tests.helpers import backfill, wait_until
from tests.helpers.needs import need_prometheus

SCRAPE = 15.0
STEP_S = 0.5
STALL_SHARE = 0.4


def _key(name, **labels):
    return tuple(sorted(dict(labels, __name__=name).items()))


def _history(end, instance, pod):
    ids = dict(job="ej", namespace="ml", rank="0", pod=pod, node="n1", instance=instance)
    t0 = end - 600
    ticks = [t0 + i * SCRAPE for i in range(int(600 / SCRAPE) + 1)]
    wait = step = count = 0.0
    out = {k: [] for k in ("w", "s", "c", "score", "info")}
    for t in ticks:
        if t > t0:
            share = STALL_SHARE if t - t0 > 300 else 0.005
            wait, step, count = wait + share * SCRAPE, step + SCRAPE, count + SCRAPE / STEP_S
        out["w"].append((t, wait))
        out["s"].append((t, step))
        out["c"].append((t, count))
        out["score"].append((t, 0.8 if t - t0 > 330 else 0.0))
        out["info"].append((t, 1.0))
    # after the last batch the agent exports the rank for its exit grace, the counters flat
    return {_key("stallscope_data_wait_seconds_sum", **ids): out["w"],
            _key("stallscope_step_seconds_sum", **ids): out["s"],
            _key("stallscope_step_seconds_count", **ids): out["c"],
            _key("stallscope_stall_cause_score", cause="too_few_workers", **ids): out["score"],
            _key("stallscope_agent_build_info", node="n1", instance=instance, version="x"): out["info"]}


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    need_prometheus()
    d = tmp_path_factory.mktemp("ended")
    agent = AgentProcess(workdir=str(d)).start()
    try:
        # one rank of pod ej-exited reported and exited: the agent holds it as exited
        code = ("import json,os,socket,time\n"
                "s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET);s.connect(%r)\n"
                "s.send(json.dumps({'v':1,'kind':'report','pid':os.getpid(),'role':'main',"
                "'dropped_total':0,'id':{'job':'ej','rank':0,'pod':'ej-exited','namespace':'ml',"
                "'node':'n1'},'events':[]}).encode())\ntime.sleep(1)\n" % agent.socket)
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
        wait_until(lambda: any(r.get("exited") for r in agent.api("/api/v1/ranks?pod=ej-exited")["ranks"]),
                   timeout=20)
        end = time.time() - 30
        instance = agent.url.split("://")[1]
        series = dict(_history(end, instance, "ej-exited"))
        series.update(_history(end, instance, "ej-gone"))
        # the pod test_a_live_rank_is_diagnosed_as_before runs live: its own, so ej-gone
        # stays gone for the tests after it (its rank, held as exited for the agent's exit
        # grace, made the suggested --window 900s command of the next test exit 2 in CI)
        series.update(_history(end, instance, "ej-live"))
        # StallscopeDataWaitHigh about ej-gone became active 100 s before the job's end
        # (ALERTS_FOR_STATE's value is its activeAt), pending since
        series[_key("ALERTS_FOR_STATE", alertname="StallscopeDataWaitHigh", job="ej", namespace="ml",
                    pod="ej-gone", rank="0")] = [(t, float(int(end - 100))) for t in
                                                 (end - 100, end - 85, end - 70, end - 55, end - 40)]
        prom = backfill.serve(series, str(d / "prom"))
        try:
            yield agent, prom, end
        finally:
            prom.stop()
    finally:
        agent.stop()


def _diagnose(prom, pod, *more):
    p = subprocess.run([sys.executable, "-m", "stallscope", "diagnose", pod, "--prometheus", prom.url,
                        *more], env=child_env(), capture_output=True, text=True, timeout=60)
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.mark.parametrize("pod", ["ej-exited", "ej-gone"])
def test_just_after_the_job_ended_its_last_minutes_are_diagnosed(ended, pod):
    agent, prom, end = ended
    p = _diagnose(prom, pod)
    first = p.stdout.splitlines()[0] if p.stdout else ""
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert first.startswith("The job ended at %s" % time.strftime("%Y-%m-%dT%H:%M", time.gmtime(end))), first
    assert first.endswith("its last 5 minutes:"), first
    assert "INPUT-BOUND" in p.stdout.splitlines()[1], p.stdout
    doc = json.loads(_diagnose(prom, pod, "--json").stdout)
    assert doc["verdict"] == "input_bound" and doc["window_seconds"] == 300, doc["reason"]
    assert doc["ended_at"] == pytest.approx(end, abs=SCRAPE + 1)
    # the last 5 minutes: the stall's share (the healthy half before it left out)
    assert doc["data_wait_ratio"] == pytest.approx(STALL_SHARE, abs=0.03), doc["data_wait_ratio"]
    assert doc["causes"] and doc["causes"][0]["cause"] == "too_few_workers", doc["causes"]
    assert [s["name"] for s in doc["sources"]] == ["prometheus"], doc["sources"]


def test_a_live_rank_is_diagnosed_as_before(ended):
    """A pod its agent still tracks live is no ended job: the agent's rank is asked."""
    agent, prom, _ = ended
    s = subprocess.Popen([sys.executable, "-c", (
        "import json,os,socket,time\n"
        "s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET);s.connect(%r)\n"
        "s.send(json.dumps({'v':1,'kind':'report','pid':os.getpid(),'role':'main','dropped_total':0,"
        "'id':{'job':'ej','rank':0,'pod':'ej-live','namespace':'ml','node':'n1'},'events':[]}).encode())\n"
        "time.sleep(30)\n") % agent.socket])
    try:
        wait_until(lambda: agent.api("/api/v1/ranks?pod=ej-live")["ranks"], timeout=20)
        doc = json.loads(_diagnose(prom, "ej-live", "--json").stdout)
        assert "ended_at" not in doc and doc["window_seconds"] == 900, doc
    finally:
        s.kill()
        s.wait()


def suggested(text):
    """The commands under "Deeper look" of a report, as printed."""
    lines = text.splitlines()
    if "Deeper look" not in lines:
        return []
    out = []
    for line in lines[lines.index("Deeper look") + 1:]:
        if not line.startswith("  $ "):
            break
        out.append(line[4:])
    return out


def run_suggested(command, cwd):
    """One suggested command, run as printed (``stallscope`` is this checkout's); the
    failures that mean it could not be run as printed: a flag it lacks, no source."""
    import shlex
    args = shlex.split(command, comments=True)
    if args[0] == "stallscope":
        args = [sys.executable, "-m", "stallscope"] + args[1:]
    p = subprocess.run(args, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)
    said = p.stdout + p.stderr
    for failure in ("No such option", "Usage:", "no source", "Error: ", "not found", "command not found"):
        assert failure not in said, (command, said[-2000:])
    return p


def test_each_suggested_command_runs_as_printed(ended, tmp_path):
    """issue 52, item 5: the `--plot` command lacked `--prometheus` and failed with "no
    source"; `-n default` named a namespace the pod is not in."""
    _, prom, _ = ended
    text = _diagnose(prom, "ej-gone").stdout
    commands = suggested(text)
    assert any("--plot" in c for c in commands), text
    for c in commands:
        p = run_suggested(c, str(tmp_path))
        assert p.returncode in (0, 1), (c, p.stderr)
    assert (tmp_path / "ej-gone.png").exists()


def test_alert_says_when_it_became_active(ended):
    """issue 52, item 6: `--alert` printed the window's centre as "active since", 5 minutes
    before the job began, while the alert was young (its centre still to come)."""
    _, prom, end = ended
    doc = json.loads(_diagnose(prom, "ej-gone", "--alert", "StallscopeDataWaitHigh", "--json").stdout)
    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(end - 100)))
    said = [w for w in doc["warnings"] if "StallscopeDataWaitHigh" in w]
    assert said and "active since %s" % began in said[0], doc["warnings"]
    assert "the window ends now" in said[0], said
