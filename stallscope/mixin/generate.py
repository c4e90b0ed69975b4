"""Render the mixin to files, write them, or compare them with files on disk.

Output is deterministic (fixed order, no timestamps) so the checked-in copies under
dashboards/, alerts/ and deploy/ can be compared byte for byte: CI fails on drift.
"""
import difflib
import json
import os
import re

from . import rules, yamlout
from .banner import BANNER

PROMETHEUS_RULE = "deploy/kubernetes/base/prometheusrule.yaml"


def _yaml(command, doc):
    return "# %s\n%s" % (BANNER % command, yamlout.dump(doc))


def alert_files(cfg):
    """{file name: text} for ``stallscope alerts``."""
    return {
        "rules.yaml": _yaml("alerts", {"groups": rules.recording_groups(cfg)}),
        "alerts.yaml": _yaml("alerts", {"groups": rules.alert_groups(cfg)}),
    }


def prometheus_rule_text(cfg):
    return _yaml("alerts --prometheusrule", rules.prometheus_rule(cfg))


def inhibit_rules_text(cfg):
    """Alertmanager inhibit_rules (rules.inhibit_rules), to merge into alertmanager.yml."""
    return ("# %s\n"
            "# Merge `inhibit_rules:` into your alertmanager.yml (docs/deploy.md, \"Alertmanager\"). A page\n"
            "# on a job's input goodput (a burn-rate alert of severity critical) mutes that job's\n"
            "# tickets: the 1x burn-rate alert and StallscopeDataWaitHigh (the 2 %% line), for the same\n"
            "# namespace and job only (another job's ticket still notifies). The cause alerts are\n"
            "# not inhibited: they say why. Checked by tests/deploy/test_alertmanager.py (amtool\n"
            "# check-config, then a real Alertmanager given a page and tickets).\n%s" % (
                BANNER % "alerts --inhibit-rules", yamlout.dump({"inhibit_rules": rules.inhibit_rules(cfg)})))


def _operator_matchers(matchers):
    out = []
    for m in matchers:
        name, op, value = re.fullmatch(r'(\w+) (=~|=) "(.*)"', m).groups()
        out.append({"name": name, "value": value, "matchType": op})
    return out


def alertmanagerconfig_text(cfg):
    """The same inhibition as a Prometheus Operator AlertmanagerConfig."""
    doc = {"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "AlertmanagerConfig",
           "metadata": {"name": "stallscope-inhibit", "labels": {"app.kubernetes.io/name": "stallscope"}},
           "spec": {"inhibitRules": [{"sourceMatch": _operator_matchers(r["source_matchers"]),
                                      "targetMatch": _operator_matchers(r["target_matchers"]),
                                      "equal": r["equal"]} for r in rules.inhibit_rules(cfg)]}}
    return ("# %s\n"
            "# The inhibition of deploy/alertmanager/inhibit-rules.yaml for an Alertmanager run by the\n"
            "# Prometheus Operator: an AlertmanagerConfig in the namespace your Alertmanager's\n"
            "# alertmanagerConfigSelector picks. The Operator adds a `namespace` matcher for this\n"
            "# object's namespace to each rule, so apply it in the namespace the alerts carry as\n"
            "# their `namespace` label (one per training namespace), or put the rule in the\n"
            "# Alertmanager's own config instead.\n%s" % (
                BANNER % "alerts --alertmanagerconfig", yamlout.dump(doc)))


def dashboard_files(cfg):
    """{file name: text} for ``stallscope dashboards``."""
    from .dashboards import all_dashboards  # grafana-foundation-sdk: only when asked for

    out = {}
    for name, model in all_dashboards(cfg):
        out[name + ".json"] = json.dumps(model, indent=2, sort_keys=True) + "\n"
    return out


def write(files, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, text in sorted(files.items()):
        path = os.path.join(out_dir, name)
        with open(path, "w") as f:
            f.write(text)
        written.append(path)
    return written


def write_file(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def drift(files, out_dir):
    """Unified diffs (one string per file) where ``out_dir`` differs from ``files``."""
    diffs = []
    for name, text in sorted(files.items()):
        diffs.extend(drift_file(os.path.join(out_dir, name), text))
    return diffs


def drift_file(path, text):
    try:
        with open(path) as f:
            have = f.read()
    except OSError:
        return ["%s: missing" % path]
    if have == text:
        return []
    return ["".join(difflib.unified_diff(have.splitlines(True), text.splitlines(True),
                                         path + " (on disk)", path + " (generated)", n=2))]
