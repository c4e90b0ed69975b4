"""The derivation of cause alerts' promtool cases (tests/helpers/alertcases.py), without
promtool: what it renders, and that it refuses what it cannot read."""
import pytest

from stallscope import vocabulary
from stallscope.mixin import config
from tests.helpers import alertcases
from tests.helpers.alertcases import CannotDerive


def test_humanize_duration_as_prometheus_writes_it():
    # template/template.go: 4 significant digits, sub-second values with a unit prefix
    assert [alertcases.humanize_duration(v) for v in (0, 0.51, 0.0005, 1.02, 2.485, 5)] == [
        "0s", "510ms", "500us", "1.02s", "2.485s", "5s"]
    assert alertcases.humanize_percentage(0.2040000001) == "20.4%"


def test_the_value_sits_just_past_the_line_for_every_shape():
    for name, (_cause, a) in vocabulary.cause_alerts().items():
        line = config.DEFAULT.line(name)
        past, before, _far = alertcases._sides(a.op, line, vocabulary.signal(a.signal).unit)
        got = alertcases.solve(a.signal, past, "p").value
        if a.op == "==":
            assert got == line and before != line, name
        else:  # a histogram quantile lands at or just past its target, never back over the line
            assert past <= got < past + 0.01 * abs(line) + 1e-9 and (got > line) == (a.op == ">"), name


def test_it_refuses_what_it_cannot_read(monkeypatch):
    with pytest.raises(CannotDerive, match="no query"):
        alertcases.solve("workers_runqueue_ratio", 0.3, "p")
    real = vocabulary.signal

    def fake(query):
        return lambda name: vocabulary.entries.Signal("x", "ratio", ("rank",), "cfs", "x", query)

    for query, why in (
            ("topk(1, stallscope_fuse_up{$sel})", "query shape"),
            ('stallscope_fuse_up{mountpoint=~"/d.*",$sel}', "matcher"),
            ("rate(stallscope_fuse_up{$sel}[$w]) / stallscope_shm_size_bytes{$sel}", "rate and a gauge")):
        monkeypatch.setattr(alertcases.vocabulary, "signal", fake(query))
        with pytest.raises(CannotDerive, match=why):
            alertcases.solve("x", 0.3, "p")
    monkeypatch.setattr(alertcases.vocabulary, "signal", real)
    with pytest.raises(CannotDerive, match="not a cause alert"):
        alertcases.cause_case(config.DEFAULT, "StallscopeAgentDown")
