"""The Alertmanager inhibition the mixin generates (deploy/alertmanager/inhibit-rules.yaml,
and the Prometheus Operator's AlertmanagerConfig in deploy/kubernetes/examples/): amtool
accepts it, and a real Alertmanager given a burn-rate page and the tickets mutes the
tickets of the paged job, and only those (issue 34: two levels fired with no inhibition
rule; issue 53: a page mutes its ticket for the same job)."""
import datetime
import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from stallscope.mixin import config, generate, rules
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


def _names(matcher):
    return matcher.split('"')[1].split("|")


def test_the_rules_are_generated_and_name_alerts_that_carry_the_equal_labels():
    assert open(RULES).read() == generate.inhibit_rules_text(config.DEFAULT)
    assert open(OPERATOR).read() == generate.alertmanagerconfig_text(config.DEFAULT)
    with open(RULES) as f:
        (rule,) = yaml.safe_load(f)["inhibit_rules"]
    groups = yaml.safe_load(generate.alert_files(config.DEFAULT)["alerts.yaml"])["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"]}
    (source,), (target,) = rule["source_matchers"], rule["target_matchers"]
    burns = {b.alert: b for b in config.DEFAULT.slo.burns}
    assert sorted(_names(source)) == sorted(n for n, b in burns.items() if b.severity == "critical") != []
    assert sorted(_names(target)) == sorted([n for n, b in burns.items() if b.severity == "warning"]
                                            + ["StallscopeDataWaitHigh"])
    for name in _names(source) + _names(target):
        assert name in alerts, name
        # every one is per (namespace, job): the equal labels exist on both sides
        assert alerts[name]["expr"].startswith(("job:", "max by (namespace, job)")), alerts[name]["expr"]
    assert rule["equal"] == ["namespace", "job"]
    assert {alerts[n]["labels"]["severity"] for n in _names(source)} == {"critical"}
    assert {alerts[n]["labels"]["severity"] for n in _names(target)} == {"warning"}
    assert rules.inhibit_rules(config.DEFAULT) == [rule]


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


def test_a_page_inhibits_its_jobs_tickets_only(alertmanager):
    now = datetime.datetime.now(datetime.timezone.utc)
    starts = (now - datetime.timedelta(minutes=1)).isoformat()
    ends = (now + datetime.timedelta(hours=1)).isoformat()

    def alert(name, severity, job):
        return {"labels": {"alertname": name, "severity": severity, "namespace": "ml", "job": job},
                "startsAt": starts, "endsAt": ends}

    fast, slow, ticket = "StallscopeInputGoodputFastBurn", "StallscopeInputGoodputSlowBurn", \
        "StallscopeInputGoodputBudgetBurn"
    sent = [alert(fast, "critical", "a"), alert(ticket, "warning", "a"),
            alert("StallscopeDataWaitHigh", "warning", "a"),
            alert(slow, "critical", "b"), alert("StallscopeDataWaitHigh", "warning", "b"),
            alert(ticket, "warning", "c"), alert("StallscopeDataWaitHigh", "warning", "c"),
            alert("StallscopeStragglerRank", "warning", "a")]
    _post(alertmanager, sent)
    muted = {(ticket, "a"), ("StallscopeDataWaitHigh", "a"), ("StallscopeDataWaitHigh", "b")}
    deadline = time.monotonic() + 30
    while True:
        got = {(a["labels"]["alertname"], a["labels"]["job"]): a["status"]
               for a in json.loads(http_get(alertmanager + "/api/v2/alerts"))}
        if len(got) == len(sent) and all(got[k]["inhibitedBy"] for k in muted):
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    for key, status in got.items():
        # the paged jobs' tickets are suppressed; the pages, job c's tickets (no page) and
        # the straggler alert (not a ticket of the SLO) still notify
        assert (status["state"] == "suppressed") == (key in muted), (key, status)


def test_the_operator_example_validates_and_says_the_same():
    with open(OPERATOR) as f:
        obj = yaml.safe_load(f)
    (rule,) = obj["spec"]["inhibitRules"]
    with open(RULES) as f:
        (plain,) = yaml.safe_load(f)["inhibit_rules"]
    for side, plain_side in (("sourceMatch", "source_matchers"), ("targetMatch", "target_matchers")):
        ((m,), (p,)) = rule[side], plain[plain_side]
        assert (m["name"], m["matchType"], m["value"]) == tuple(p.split(" ", 2)[:2]) + (p.split('"')[1],)
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
