"""The labelled evaluation set (tests/data/traces): every trace diagnosed as labelled."""
import json
import os

import pytest

from stallscope.correlate import evaluate

DOCS = evaluate.load(evaluate.DEFAULT_DIR)


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


def test_synthetic_traces_match_their_generator(tmp_path):
    evaluate.write_synthetic(str(tmp_path))
    for name in sorted(os.listdir(tmp_path)):
        with open(tmp_path / name) as f:
            fresh = json.load(f)
        with open(os.path.join(evaluate.DEFAULT_DIR, name)) as f:
            stored = json.load(f)
        assert fresh == stored, "%s is stale: run python -m stallscope.correlate.evaluate --write-synthetic" % name


def test_cli_prints_the_confusion_table(capsys):
    assert evaluate.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "expected cause" in out and "%d/%d traces as expected" % (len(DOCS), len(DOCS)) in out
    assert evaluate.main([os.path.dirname(__file__)]) == 2  # no traces there: one-line error
