"""The Alertmanager inhibition example (deploy/alertmanager/inhibit-rules.yaml, and the
Prometheus Operator's AlertmanagerConfig in deploy/kubernetes/examples/): amtool accepts
it, and a real Alertmanager given both data-wait alerts mutes the warning under the
critical for the same namespace and job, and only there (issue 34: Warning and
Critical both fired above 10 % with no inhibition rule)."""
import datetime
import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from stallscope.mixin import config, generate
from stallscope.processes.servers import free_port, http_get
from tests.helpers import ROOT

RULES = os.path.join(ROOT, "deploy", "alertmanager", "inhibit-rules.yaml")
OPERATOR = os.path.join(ROOT, "deploy", "kubernetes", "examples", "alertmanagerconfig.yaml")
BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def _config(tmp_path):
    """A minimal alertmanager.yml: one receiver that drops everything, and the rules."""
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    cfg = {"route": {"receiver": "null", "group_wait": "1s"}, "receivers": [{"name": "null"}]}
    cfg.update(rules)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_rules_name_generated_alerts_that_carry_the_equal_labels():
    with open(RULES) as f:
        (rule,) = yaml.safe_load(f)["inhibit_rules"]
    groups = yaml.safe_load(generate.alert_files(config.DEFAULT)["alerts.yaml"])["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"]}
    for side in ("source_matchers", "target_matchers"):
        (m,) = rule[side]
        name = m.split("=")[1].strip().strip('"')
        assert name in alerts, name
        assert "max by (namespace, job)" in alerts[name]["expr"], alerts[name]["expr"]
    assert rule["equal"] == ["namespace", "job"]
    assert alerts["StallscopeDataWaitCritical"]["labels"]["severity"] == "critical"
    assert alerts["StallscopeDataWaitHigh"]["labels"]["severity"] == "warning"


def test_amtool_accepts_the_config(tmp_path):
    amtool = shutil.which("amtool")
    if not amtool:
        pytest.skip("needs Debian's prometheus-alertmanager (scripts/install-system-deps)")
    r = subprocess.run([amtool, "check-config", str(_config(tmp_path))], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "1 inhibit rules" in r.stdout, r.stdout + r.stderr


def _post(url, alerts):
    req = urllib.request.Request(url + "/api/v2/alerts", data=json.dumps(alerts).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


@pytest.fixture
def alertmanager(tmp_path):
    if not BINARY:
        pytest.skip("needs Debian's prometheus-alertmanager (scripts/install-system-deps)")
    port = free_port()
    log = open(tmp_path / "am.log", "w")
    proc = subprocess.Popen([BINARY, "--config.file", str(_config(tmp_path)),
                             "--storage.path", str(tmp_path / "data"),
                             "--web.listen-address", "127.0.0.1:%d" % port,
                             "--cluster.listen-address", ""], stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                http_get(url + "/-/ready")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, open(tmp_path / "am.log").read()
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_critical_inhibits_the_warning_for_the_same_job_only(alertmanager):
    now = datetime.datetime.now(datetime.timezone.utc)
    starts = (now - datetime.timedelta(minutes=1)).isoformat()
    ends = (now + datetime.timedelta(hours=1)).isoformat()

    def alert(name, severity, job):
        return {"labels": {"alertname": name, "severity": severity, "namespace": "ml", "job": job},
                "startsAt": starts, "endsAt": ends}

    _post(alertmanager, [alert("StallscopeDataWaitCritical", "critical", "a"),
                         alert("StallscopeDataWaitHigh", "warning", "a"),
                         alert("StallscopeDataWaitHigh", "warning", "b")])
    deadline = time.monotonic() + 30
    while True:
        got = {(a["labels"]["alertname"], a["labels"]["job"]): a["status"]
               for a in json.loads(http_get(alertmanager + "/api/v2/alerts"))}
        if len(got) == 3 and got[("StallscopeDataWaitHigh", "a")]["inhibitedBy"]:
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    assert got[("StallscopeDataWaitHigh", "a")]["state"] == "suppressed", got
    assert not got[("StallscopeDataWaitHigh", "b")]["inhibitedBy"], got  # another job
    assert not got[("StallscopeDataWaitCritical", "a")]["inhibitedBy"], got


def test_the_operator_example_validates_and_says_the_same():
    with open(OPERATOR) as f:
        obj = yaml.safe_load(f)
    (rule,) = obj["spec"]["inhibitRules"]
    with open(RULES) as f:
        (plain,) = yaml.safe_load(f)["inhibit_rules"]
    assert [m["value"] for m in rule["sourceMatch"]] == ["StallscopeDataWaitCritical"]
    assert [m["value"] for m in rule["targetMatch"]] == ["StallscopeDataWaitHigh"]
    assert rule["equal"] == plain["equal"]
    node_modules = os.path.join(ROOT, "tests", "deploy", "node_modules")
    if not shutil.which("node") or not os.path.isdir(node_modules):
        pytest.skip("needs node and `npm ci --prefix tests/deploy` (make setup does it)")
    r = subprocess.run(["node", os.path.join(ROOT, "tests", "deploy", "validate-crds.mjs")],
                       input=json.dumps([obj]), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "ok AlertmanagerConfig/stallscope-inhibit" in r.stdout, r.stdout + r.stderr
    broken = dict(obj, spec={"inhibitRules": [{"sourceMatch": [{"name": "alertname", "matchType": "~"}]}]})
    r = subprocess.run(["node", os.path.join(ROOT, "tests", "deploy", "validate-crds.mjs")],
                       input=json.dumps([broken]), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "invalid AlertmanagerConfig" in r.stdout, r.stdout
