"""deploy/prometheus/prometheus.yml, the example for machines outside Kubernetes (issue 52,
item 8): a configuration Prometheus accepts, its rule files the generated ones (found
and valid), the agents scraped with honor_labels."""
import os
import shutil
import subprocess

import pytest
import yaml

from tests.helpers import ROOT

CONFIG = os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")


def test_the_example_is_a_valid_config_loading_the_generated_rules():
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    out = subprocess.run(["promtool", "check", "config", CONFIG], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert "alerts/rules.yaml" in said and "alerts/alerts.yaml" in said, said
    with open(CONFIG) as f:
        doc = yaml.safe_load(f)
    [job] = doc["scrape_configs"]
    assert job["honor_labels"] is True
