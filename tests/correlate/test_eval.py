"""The labelled evaluation set (tests/data/traces): every trace diagnosed as labelled,
and every trace tied to its scenario in the lab's one table."""
import json
import os

import pytest

from stallscope.lab import evaluate, scenarios, traces

DOCS = traces.load(traces.DEFAULT_DIR)


def test_the_set_has_real_and_synthetic_traces_for_every_verdict():
    sources = {d["labels"]["source"] for _, d in DOCS}
    assert {"recorded", "synthetic"} <= sources
    verdicts = {d["labels"]["expected_verdict"] for _, d in DOCS}
    assert {"healthy", "input_bound", "not_input_bound"} <= verdicts


@pytest.mark.parametrize("path, doc", DOCS, ids=[os.path.basename(p) for p, _ in DOCS])
def test_trace_is_diagnosed_as_labelled(path, doc):
    r = evaluate.row(path, doc)
    assert r["ok"], r
    if doc["labels"]["expected_verdict"] == "healthy":
        assert r["verdict"] != "input_bound"


@pytest.mark.parametrize("path, doc", DOCS, ids=[os.path.basename(p) for p, _ in DOCS])
def test_trace_comes_from_a_scenario_of_the_table_and_carries_its_labels(path, doc):
    """lab-NAME.json is a recording of NAME's real run, syn-NAME.json its synthetic
    generator's: no trace from elsewhere, no labels that disagree with the table."""
    prefix, name = os.path.basename(path)[:-len(".json")].split("-", 1)
    s = scenarios.get(name)
    assert (prefix, doc["labels"]["source"]) in (("lab", "recorded"), ("syn", "synthetic"))
    assert (s.real if prefix == "lab" else s.synthetic) is not None
    assert doc["labels"]["scenario"] == "%s-%s" % (prefix, name)
    verdict, cause = s.trace_labels()
    assert (doc["labels"]["expected_verdict"], doc["labels"]["expected_cause"]) == (verdict, cause)


def test_every_real_scenario_has_a_recording_and_every_synthetic_one_its_trace():
    names = {os.path.basename(p) for p, _ in DOCS}
    assert {"lab-%s.json" % s.name for s in scenarios.REAL} <= names
    assert {"syn-%s.json" % s.name for s in scenarios.SYNTHETIC} <= names


def test_synthetic_traces_match_their_generator(tmp_path):
    traces.write_synthetic(str(tmp_path))
    for name in sorted(os.listdir(tmp_path)):
        with open(tmp_path / name) as f:
            fresh = json.load(f)
        with open(os.path.join(traces.DEFAULT_DIR, name)) as f:
            stored = json.load(f)
        assert fresh == stored, "%s is stale: run python -m stallscope.lab.evaluate --write-synthetic" % name


def test_cli_prints_the_confusion_table(capsys):
    assert evaluate.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "expected cause" in out and "%d/%d traces as expected" % (len(DOCS), len(DOCS)) in out
    assert evaluate.main([os.path.dirname(__file__)]) == 2  # no traces there: one-line error
