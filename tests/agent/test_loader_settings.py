"""The loader's settings typed where they enter (issue 51, item 1): the wire's
validation makes a LoaderSettings, and the JSON the API and the trace files have always
carried comes back out of it unchanged."""
import glob
import json
import os

from stallscope.agent.table import state, validate
from stallscope.report import UNREPORTED, LoaderSettings, ReportedError
from tests.agent.test_validate import good
from tests.helpers import ROOT

SETTINGS = {"num_workers": 3, "prefetch_factor": 4, "pin_memory": True, "persistent_workers": False,
            "batch_size": 16}


def test_the_wire_makes_typed_settings_and_a_rank_keeps_the_settings_alone():
    error = {"type": "RuntimeError", "message": "boom", "at_ns": 7}
    msg = validate.parse(good(loader=dict(SETTINGS, worker_pids=[11, 12], worker_exits=[[11, -9]],
                                          batch_bytes=1 << 20, error=error)))
    loader = msg.loader
    assert isinstance(loader, LoaderSettings)
    assert (loader.num_workers, loader.prefetch_factor, loader.batch_size) == (3, 4, 16)
    assert (loader.pin_memory, loader.persistent_workers) == (True, False)
    assert loader.worker_pids == (11, 12) and loader.worker_exits == ((11, -9),)
    assert loader.error == ReportedError("RuntimeError", "boom", 7)
    # what a rank keeps and the API shows: the settings, the measured size; no PIDs, no error
    table = state.RankTable()
    rank = table.apply(msg)
    assert rank.loader == LoaderSettings(**SETTINGS, batch_bytes=1 << 20)
    assert rank.loader_error == ReportedError("RuntimeError", "boom", 7)
    assert rank.as_json(0.0)["loader"] == dict(SETTINGS, batch_bytes=1 << 20)
    # a later report without a measured size keeps the last one (issue 32)
    rank = table.apply(validate.parse(good(loader=dict(SETTINGS, num_workers=5))))
    assert rank.loader.num_workers == 5 and rank.loader.batch_bytes == 1 << 20


def test_a_setting_not_reported_is_none_and_written_as_null():
    assert UNREPORTED.num_workers is None and (None or UNREPORTED).batch_bytes is None
    assert LoaderSettings(num_workers=2).to_json() == {
        "num_workers": 2, "prefetch_factor": None, "batch_size": None, "pin_memory": None,
        "persistent_workers": None}


def recorded_loaders():
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "**", "*.json"), recursive=True)):
        with open(path) as f:
            try:
                body = json.load(f)
            except ValueError:
                continue
        stack = [body]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                if isinstance(x.get("loader"), dict):
                    out.append(x["loader"])
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
    return out


def test_every_recorded_loader_reads_back_as_it_was_written():
    """The traces, draws and fixtures recorded by earlier code: each loader they hold
    comes back out of its LoaderSettings as it was written."""
    loaders = recorded_loaders()
    assert len(loaders) >= 90  # the recorded set holds ~100 (traces, draws)
    bad = [x for x in loaders if LoaderSettings.from_json(x).to_json() != x]
    assert bad == []
