"""Runbooks and alerts match one to one; every runbook has Meaning, Impact, Diagnosis
(starting with the exact `stallscope diagnose` command) and Mitigation."""
import os
import re

from stallscope.mixin import alerts, config, rules
from tests.helpers import ROOT

RUNBOOKS = os.path.join(ROOT, "runbooks")
SECTIONS = ["## Meaning", "## Impact", "## Diagnosis", "## Mitigation"]
FIRST_COMMAND = "`stallscope diagnose <pod> -n <namespace>`"


def pages():
    return {f[:-3]: open(os.path.join(RUNBOOKS, f)).read()
            for f in os.listdir(RUNBOOKS) if f.endswith(".md") and f != "README.md"}


def test_every_alert_has_a_runbook_and_every_runbook_an_alert():
    names = {a.name for a in alerts.all_alerts(config.DEFAULT)}
    assert set(pages()) == names


def test_runbook_urls_point_at_the_runbooks():
    for group in rules.alert_groups(config.DEFAULT):
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            assert url == config.DEFAULT.runbook_base_url + rule["alert"] + ".md"
            assert os.path.exists(os.path.join(RUNBOOKS, url.rsplit("/", 1)[1]))


def test_runbooks_have_the_four_sections_and_start_diagnosis_with_diagnose():
    for name, text in pages().items():
        lines = text.splitlines()
        assert lines[0] == "# " + name, name
        heads = [line for line in lines if line.startswith("## ")]
        assert heads == SECTIONS, (name, heads)
        diagnosis = text.split("## Diagnosis\n", 1)[1].split("## Mitigation", 1)[0]
        first = next(line for line in diagnosis.splitlines() if line.strip())
        assert first.startswith("1. " + FIRST_COMMAND), (name, first)
        for section in text.split("## ")[1:]:
            assert len(section.split("\n", 1)[1].strip()) > 80, (name, section[:20])


def test_links_between_runbooks_resolve():
    for name, text in pages().items():
        for target in re.findall(r"\]\(([^)#]+\.md)\)", text):
            assert os.path.exists(os.path.join(RUNBOOKS, target)), (name, target)
