"""The derivation of cause alerts' promtool cases (tests/helpers/alertcases.py), without
promtool: what it renders, and that it refuses what it cannot read."""
import dataclasses

import pytest

from stallscope import vocabulary
from stallscope.mixin import config
from tests.helpers import alertcases
from tests.helpers.alertcases import CannotDerive


def test_humanize_duration_as_prometheus_writes_it():
    # template/template.go: 4 significant digits, sub-second values with a unit prefix,
    # whole seconds from a minute up
    values = (0, 0.51, 0.0005, 1.02, 2.485, 5, 61.2, 3725, 90061)
    assert [alertcases.humanize_duration(v) for v in values] == [
        "0s", "510ms", "500us", "1.02s", "2.485s", "5s", "1m 1s", "1h 2m 5s", "1d 1h 1m 1s"]
    assert alertcases.humanize_percentage(0.2040000001) == "20.4%"


def test_humanize_and_the_value_as_prometheus_writes_them():
    assert [alertcases.humanize(v) for v in (0, 0.0012, 0.5, 999, 1000, 1234567, 2.5e9)] == [
        "0", "1.2m", "500m", "999", "1k", "1.235M", "2.5G"]
    assert [alertcases.humanize1024(v) for v in (1, 1023, 1024, 5 << 20)] == ["1", "1023", "1ki", "5Mi"]
    # {{ $value }}: Go's %v of a float64, shortest digits, exponent from 1e6 and under 1e-4
    assert [alertcases.go_float(v) for v in (0.255, 2.0, 123456.0, 1.5e6, 1e-5, 0.0001)] == [
        "0.255", "2", "123456", "1.5e+06", "1e-05", "0.0001"]
    text = ('{{ $labels.pod }}: {{ $value | humanize }}, {{ $value | humanizeDuration }}, '
            '{{ printf "%.1f" $value }}, {{ $value }}')
    assert alertcases.render(text, {"pod": "p"}, 91.8) == "p: 91.8, 1m 31s, 91.8, 91.8"


def test_a_line_of_a_minute_or_more_and_any_matcher_derive(monkeypatch):
    # issue 51: a line of 60 or more, or a description using humanize, could not be
    # derived, and a newcomer hand-wrote the case instead
    slow = vocabulary.CauseAlert(
        "StallscopeTestProbeSlow", "fuse_probe_seconds", ">", 90.0, "{{ $value | humanize }}s",
        "{{ $labels.mountpoint }} of <where>: {{ $value | humanizeDuration }} (threshold <line>).")
    cause = dataclasses.replace(vocabulary.cause("fuse_unhealthy"), alerts=(slow,))
    monkeypatch.setattr(vocabulary, "cause_alerts", lambda: {slow.name: (cause, slow)})
    c = alertcases.cause_case(config.DEFAULT, slow.name)
    [(labels, summary, description)] = c.expected
    assert summary == "91.8s" and description.startswith(
        "/data of pod ml/train-0 (job train, node n1): 1m 31s (threshold 90s).")
    # a regex, a negative and an equality matcher each pick a value that matches
    m = alertcases._matchers('io!="block", tier=~"remote|disk", mountpoint=~"/d.*", reason="x"')
    picked = {label: m[label].pick(label, alertcases.EXAMPLE.get(label)) for label in m}
    assert picked == {"io": "io-x", "tier": None, "mountpoint": None, "reason": "x"}
    assert m["tier"].pick("tier", "cache") == "remote"


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
            ('stallscope_fuse_up{mountpoint=~"[",$sel}', "matcher"),
            ('stallscope_fuse_up{mountpoint=~"/z.*",$sel}', "no value of label mountpoint"),
            ("rate(stallscope_fuse_up{$sel}[$w]) / stallscope_shm_size_bytes{$sel}", "rate and a gauge")):
        monkeypatch.setattr(alertcases.vocabulary, "signal", fake(query))
        with pytest.raises(CannotDerive, match=why):
            alertcases.solve("x", 0.3, "p")
    monkeypatch.setattr(alertcases.vocabulary, "signal", real)
    with pytest.raises(CannotDerive, match="not a cause alert"):
        alertcases.cause_case(config.DEFAULT, "StallscopeAgentDown")
