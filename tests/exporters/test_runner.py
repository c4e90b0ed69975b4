"""The exporter framework: scheduling off the scrape path, deadlines, a stuck exporter
never restarted, failures isolated, "not available" reported once and an error only
when the exporter was asked for explicitly, and the flags that choose exporters."""
import json
import threading
import urllib.error

import pytest
from prometheus_client.core import GaugeMetricFamily

from stallscope import exporters
from stallscope.exporters import base, registry, runner
from tests.helpers import wait_until
from tests.helpers.exporters import context, values


class Fixed(base.Exporter):
    name = "fixed"

    def collect(self):
        g = GaugeMetricFamily("test_fixed", "x", labels=["n"])
        g.add_metric([str(len(self.host.ranks()))], 1)
        return [g]


class Raising(base.Exporter):
    name = "raising"

    def collect(self):
        raise OSError(5, "Input/output error")


class Hanging(base.Exporter):
    name = "hanging"

    def __init__(self, host):
        super().__init__(host)
        self.release = threading.Event()
        self.calls = 0

    def collect(self):
        self.calls += 1
        self.release.wait(30)
        return [GaugeMetricFamily("test_hanging", "x", value=self.calls)]


class Missing(base.Exporter):
    name = "missing"

    def unavailable(self):
        return "no /proc/pressure"

    def collect(self):
        raise AssertionError("must not be collected")


def make(*pairs, deadline=0.2):
    ctx = context()
    run = runner.Runner(ctx, [(cls(ctx), explicit) for cls, explicit in pairs],
                        runner.ExportersOptions(timeout=deadline))
    return run, ctx.stopping


def test_failures_are_isolated_and_logged_once(capsys):
    run, stop = make((Fixed, False), (Raising, False))
    run.collect_now()
    run.collect_now()
    fams = list(run.collect())
    assert values(fams, "stallscope_exporter_success", exporter="fixed") == [1]
    assert values(fams, "stallscope_exporter_success", exporter="raising") == [0]
    assert values(fams, "test_fixed") == [1]
    err = capsys.readouterr().err
    assert err.count("exporter raising failed: OSError") == 1
    assert [s["failures"] for s in run.status()] == [0, 2]


def test_a_stuck_exporter_is_not_restarted_and_never_delays_the_scrape(capsys):
    run, stop = make((Fixed, False), (Hanging, False), deadline=0.2)
    hanging = run.slots[1].exporter
    try:
        run.tick()
        wait_until(lambda: hanging.calls == 1)
        # The scrape reads what the threads left: it returns while the exporter hangs.
        fams = list(run.collect())
        assert values(fams, "test_hanging") == []
        wait_until(lambda: values(list(run.collect()), "stallscope_exporter_success",
                                  exporter="hanging") == [0])
        for _ in range(3):
            run.tick()
        fams = list(run.collect())
        assert hanging.calls == 1, "a stuck exporter was started again"
        assert values(fams, "stallscope_exporter_duration_seconds", exporter="hanging")[0] > 0.2
        assert values(fams, "stallscope_exporter_success", exporter="fixed") == [1]
        assert "hanging: still running" in capsys.readouterr().err
        hanging.release.set()
        wait_until(lambda: run.slots[1].running_since is None)
        # It returned late: its data is served, its success says it missed the deadline.
        fams = list(run.collect())
        assert values(fams, "test_hanging") == [1]
        assert values(fams, "stallscope_exporter_success", exporter="hanging") == [0]
        run.tick()
        wait_until(lambda: hanging.calls == 2 and run.slots[1].running_since is None)
        fams = list(run.collect())
        assert values(fams, "stallscope_exporter_success", exporter="hanging") == [1]
    finally:
        hanging.release.set()
        stop.set()


def test_not_available_is_said_once_and_is_an_error_only_when_asked_for(capsys):
    run, stop = make((Missing, False))
    run.collect_now()
    run.collect_now()
    fams = list(run.collect())
    assert values(fams, "stallscope_exporter_available", exporter="missing") == [0]
    assert values(fams, "stallscope_exporter_success", exporter="missing") == [1]
    assert capsys.readouterr().err.count("not available on this node (no /proc/pressure)") == 1
    run, stop = make((Missing, True))
    run.collect_now()
    fams = list(run.collect())
    assert values(fams, "stallscope_exporter_success", exporter="missing") == [0]
    assert "enabled with --exporter.missing but not available" in capsys.readouterr().err


def test_flags_choose_exporters():
    names = [e.name for e in registry.EXPORTERS]
    assert "cfs" in names
    ctx = context()
    _, all_on = exporters.build(ctx, {}, {})
    assert [s.name for s in all_on.slots] == [e.name for e in registry.EXPORTERS if e.default]
    assert not any(s.explicit for s in all_on.slots)
    _, off = exporters.build(ctx, {"cfs": False}, {})
    assert "cfs" not in [s.name for s in off.slots]
    _, on = exporters.build(ctx, {"cfs": True}, {})
    assert [s.explicit for s in on.slots if s.name == "cfs"] == [True]


def test_cli_flags_reach_the_agent(agent_factory):
    a = agent_factory("--no-exporter.cfs", "--exporter.interval", "0.2")
    names = [e["exporter"] for e in a.api("/api/v1/exporters")["exporters"]]
    assert "cfs" not in names
    b = agent_factory("--exporter.interval", "0.2")
    wait_until(lambda: 'stallscope_exporter_success{exporter="cfs"} 1.0' in b.metrics())
    status = {e["exporter"]: e for e in b.api("/api/v1/exporters")["exporters"]}
    assert status["cfs"]["available"] is True and status["cfs"]["runs"] >= 1
    with pytest.raises(urllib.error.HTTPError) as e:
        b.api("/api/v1/exporters?x=1")
    assert e.value.code == 400 and "unknown parameters: x" in json.loads(e.value.read())["error"]


class Probe(base.Exporter):
    """Records when it collects, and how many exporters collect at once."""
    name = "probe"
    active = 0
    most = 0
    order: list = []
    lock = threading.Lock()

    def collect(self):
        with Probe.lock:  # the counts are the base class's, shared by every probe
            Probe.active += 1
            Probe.most = max(Probe.most, Probe.active)
            Probe.order.append(self.name)
        threading.Event().wait(0.02)  # long enough for a second thread to overlap
        with Probe.lock:
            Probe.active -= 1
        return [GaugeMetricFamily("test_" + self.name, "x", value=1)]


def probes(n):
    return [type("Probe%d" % i, (Probe,), {"name": "probe%d" % i}) for i in range(n)]


def test_a_pass_is_a_relay_one_exporter_at_a_time_in_order():
    Probe.active = Probe.most = 0
    Probe.order = []
    classes = probes(6)
    run, stop = make(*[(c, False) for c in classes], deadline=1.0)
    try:
        run.tick()
        wait_until(lambda: all(s.runs == 1 for s in run.slots))
        run.tick()  # a second pass once the first is over
        wait_until(lambda: all(s.runs == 2 for s in run.slots))
        assert Probe.most == 1, "two exporters collected at once"
        names = [c.name for c in classes]
        assert Probe.order == names + names
    finally:
        stop.set()


def test_a_pass_goes_on_past_an_exporter_stuck_beyond_its_deadline():
    run, stop = make((Hanging, False), (Fixed, False), deadline=0.2)
    hanging = run.slots[0].exporter
    try:
        run.tick()
        wait_until(lambda: hanging.calls == 1)
        run.tick()  # within the deadline: the pass waits for it
        assert run.slots[1].runs == 0
        wait_until(lambda: values(list(run.collect()), "stallscope_exporter_success",
                                  exporter="hanging") == [0])
        run.tick()  # past it: the rest of the pass collects beside the stuck one
        wait_until(lambda: run.slots[1].runs == 1)
        assert hanging.calls == 1 and run.slots[0].running_since is not None
    finally:
        hanging.release.set()
        stop.set()
