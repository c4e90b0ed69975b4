"""Render the mixin to files, write them, or compare them with files on disk.

Output is deterministic (fixed order, no timestamps) so the checked-in copies under
dashboards/, alerts/ and deploy/ can be compared byte for byte: CI fails on drift.
"""
import difflib
import json
import os

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
