"""The vocabulary against itself and the rest of the repository: every cause has an
alert, a runbook and advice; every signal a producer; the docs list the exporters the
registry has; the generated reference is current. (Emission is checked against a real
agent in test_emitted.py.)"""
import os
import re

import pytest
import yaml

from stallscope import vocabulary
from stallscope.host import families
from stallscope.vocabulary import reference
from tests.helpers import ROOT

CORE_PARTS = ("ranks", "loader", "shards", "exporters", "correlator", "agent")


def alerts_yaml():
    with open(os.path.join(ROOT, "alerts", "alerts.yaml")) as f:
        doc = yaml.safe_load(f)
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


@pytest.mark.parametrize("cause", vocabulary.CAUSES, ids=lambda c: c.name)
def test_every_cause_has_an_alert_a_runbook_and_advice(cause):
    alerts = alerts_yaml()
    assert cause.advice.strip(), "no advice"
    assert cause.runbook_alert in alerts, "runbook alert %s is not generated" % cause.runbook_alert
    assert os.path.exists(os.path.join(ROOT, cause.runbook)), "no %s" % cause.runbook
    for a in cause.alerts:
        assert a.name in alerts, "cause alert %s is not in alerts/alerts.yaml" % a.name
        assert os.path.exists(os.path.join(ROOT, "runbooks", a.name + ".md"))
        assert alerts[a.name]["annotations"]["runbook_url"].endswith("/%s.md" % a.name)


@pytest.mark.parametrize("signal", vocabulary.SIGNALS, ids=lambda s: s.name)
def test_every_signal_has_a_producer(signal):
    producers = set(CORE_PARTS) | {e.name for e in vocabulary.EXPORTERS}
    assert signal.producer in producers


def test_every_metric_has_a_producer():
    producers = set(CORE_PARTS) | {e.name for e in vocabulary.EXPORTERS}
    assert [m.name for m in vocabulary.METRICS if m.producer not in producers] == []


def test_every_line_the_correlator_probes_is_a_declared_signal():
    probed = {line.signal for c in vocabulary.CAUSES for line in c.lines}
    assert probed <= set(vocabulary.SIGNAL)


def test_an_alert_line_that_differs_from_the_cause_line_says_why():
    for c in vocabulary.CAUSES:
        for a in c.alerts:
            line = next((candidate for candidate in c.lines if candidate.signal == a.signal), None)
            if line is not None and line.threshold != a.line and a.op != "==":
                assert a.why, "%s: alert line %g vs co-occurrence line %g, no reason" % (
                    a.name, a.line, line.threshold)


def test_only_declared_metrics_can_be_built():
    with pytest.raises(KeyError):
        families.family("stallscope_not_declared_total")


def test_the_generated_reference_is_current():
    drift = reference.files(os.path.join(ROOT, "docs"))
    for path, text in drift.items():
        with open(path) as f:
            assert f.read() == text, "%s is stale: run make generate" % path


def test_docs_list_the_exporters_the_registry_has():
    names = [e.name for e in vocabulary.EXPORTERS]
    with open(os.path.join(ROOT, "docs", "exporters.md")) as f:
        text = f.read()
    block = text.partition(reference.BEGIN)[2].partition(reference.END)[0]
    listed = re.findall(r"^\| `([a-z_]+)` \|", block, re.M)
    assert listed == names
    # Anywhere in the docs, a list naming three or more exporters names them all, quoted
    # (`cfs`) or not (the list in docs/design.md is generated).
    name = "`?(?:%s)`?" % "|".join(names)
    pattern = re.compile(r"\((%s(?:, %s)+)\)" % (name, name))
    listed_in = []
    docs = [os.path.join(ROOT, "docs", d) for d in sorted(os.listdir(os.path.join(ROOT, "docs")))]
    for path in docs + [os.path.join(ROOT, "README.md")]:
        doc = os.path.basename(path)
        with open(path) as f:
            for m in pattern.finditer(f.read()):
                found = m.group(1).replace("`", "").split(", ")
                if len(found) >= 3:
                    listed_in.append(doc)
                    assert sorted(found) == sorted(names), "%s lists %s" % (doc, found)
    assert "design.md" in listed_in


def _threshold_texts(line):
    """How prose may write a line's threshold: 0.5, < 0.5, 50 ms, 1 s, 50 MB/s, 25%."""
    t = line.threshold
    unit = vocabulary.signal(line.signal).unit
    texts = {"%g" % t, vocabulary.unit_text(unit, t)}
    if unit == "seconds":
        texts |= {"%g s" % t, "%g ms" % (t * 1000)}
    if unit == "bytes_rate":
        texts.add("%g MB/s" % (t / 1e6))
    return texts


def test_the_correlator_docs_cause_table_is_the_vocabularys():
    """docs/correlator.md's cause table: one row a cause of the vocabulary, each of its
    lines' signals named with the threshold, a standing cause's row says so."""
    with open(os.path.join(ROOT, "docs", "correlator.md")) as f:
        text = f.read()
    table = text.partition("| cause | signals (threshold) |")[2].partition("\n\n")[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (.*) \|$", table, re.M))
    assert sorted(rows) == sorted(vocabulary.CAUSE_NAMES)
    assert len(re.findall(r"^\| `", table, re.M)) == len(rows), "a cause has two rows"
    for c in vocabulary.CAUSES:
        row = rows[c.name]
        assert row.startswith("standing") == (c.kind == "standing"), c.name
        for line in c.lines:
            head, found, after = row.partition("`%s`" % line.signal)
            assert found, "%s: its row does not name %s" % (c.name, line.signal)
            after = after.split("`")[0]  # up to the next name
            written = [t for t in _threshold_texts(line)
                       if re.search(r"(?<![\d.])%s(?![\d])" % re.escape(t), after)]
            assert written, "%s: %s's threshold %g is not next to it in %r" % (
                c.name, line.signal, line.threshold, after)


@pytest.mark.parametrize("cause", vocabulary.CAUSES, ids=lambda c: c.name)
def test_a_standing_condition_is_never_judged_by_co_occurrence(cause):
    # issue 29: a condition that holds all along (a set-up or placement fact) scores ~0
    # against the stalls, so only a standing cause, with a model, may be judged on one
    from stallscope.correlate import standing_causes
    on_conditions = [line.signal for line in cause.lines if vocabulary.signal(line.signal).condition]
    if cause.kind == "standing":
        assert cause.lines and len(on_conditions) == len(cause.lines), cause.name
        assert cause.name in standing_causes.MODELS, "a standing cause needs a model"
    else:
        assert on_conditions == [], "%s (%s) is judged on a condition: declare it standing" % (
            cause.name, cause.kind)


@pytest.mark.parametrize("cause", vocabulary.CAUSES, ids=lambda c: c.name)
def test_advice_that_changes_a_setting_has_an_alternative(cause):
    # a next step never recommends what the top cause's prediction rules out (issue 29)
    assert bool(cause.advises) == bool(cause.advice_otherwise), cause.name
    assert not set(cause.advises) - {"num_workers", "cpu_limit_cores", "prefetch_factor",
                                     "persistent_workers", "pin_memory"}
