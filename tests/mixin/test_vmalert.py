"""The generated rule files are accepted by both rule evaluators a user may run them on:
Prometheus (`promtool check rules`) and VictoriaMetrics' vmalert (`-dryRun`, which parses
every expression with the MetricsQL engine and every annotation template with vmalert's
template functions). The scale-out path (deploy/victoriametrics, docs/deploy.md) loads
these same files into vmalert. A rule file broken on purpose shows the checks can fail."""
import os
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

RULE_FILES = [os.path.join(ROOT, "alerts", "rules.yaml"), os.path.join(ROOT, "alerts", "alerts.yaml")]

BROKEN_EXPR = """groups:
  - name: broken
    rules:
      - alert: Broken
        expr: sum(rate(stallscope_step_seconds_count[5m]) by
"""
BROKEN_TEMPLATE = """groups:
  - name: broken
    rules:
      - alert: Broken
        expr: up == 0
        annotations:
          description: "{{ $value | noSuchFunction }}"
"""


def vmalert_dry_run(*rule_files):
    if not shutil.which("vmalert"):
        pytest.skip("needs vmalert (apt-get install victoria-metrics)")
    args = ["vmalert", "-dryRun", "-loggerLevel=ERROR"] + ["-rule=%s" % f for f in rule_files]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def promtool_check(*rule_files):
    if not shutil.which("promtool"):
        pytest.skip("needs promtool (apt-get install prometheus)")
    return subprocess.run(["promtool", "check", "rules", *rule_files],
                          capture_output=True, text=True, timeout=60)


def test_vmalert_accepts_generated_rules():
    r = vmalert_dry_run(*RULE_FILES)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_accepts_generated_rules():
    r = promtool_check(*RULE_FILES)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("text, reason", [(BROKEN_EXPR, "bad prometheus expr"),
                                          (BROKEN_TEMPLATE, "noSuchFunction")])
def test_vmalert_dry_run_rejects_broken_rules(tmp_path, text, reason):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    r = vmalert_dry_run(str(path))
    assert r.returncode != 0
    assert reason in r.stdout + r.stderr


def test_promtool_rejects_broken_rules(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN_EXPR)
    assert promtool_check(str(path)).returncode != 0
