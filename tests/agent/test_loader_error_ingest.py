"""The loader's own error and its first batch's bytes in a hook report (issue 32): the
agent takes what a real hook can send, refuses (and counts) what it cannot, and keeps
the error for the process while later reports no longer carry it."""
import json

import pytest

from stallscope.agent.table import state, validate
from stallscope.hook import errors
from tests.agent.test_validate import good, ingest_of

LOADER = {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False,
          "batch_size": 4, "worker_pids": [11, 12]}
ERROR = {"type": "RuntimeError", "message": "Caught RuntimeError in DataLoader worker process 0. | "
         "RuntimeError: unable to allocate shared memory(shm): No space left on device (28)",
         "at_ns": 5}


def test_a_real_hooks_error_and_batch_bytes_are_taken():
    msg = validate.parse(good(loader=dict(LOADER, batch_bytes=3 << 20, error=ERROR)))
    assert msg.loader.batch_bytes == 3 << 20 and msg.loader.error.to_json() == ERROR


@pytest.mark.parametrize("loader", [
    dict(LOADER, batch_bytes=0),
    dict(LOADER, batch_bytes="3"),
    dict(LOADER, batch_bytes=1 << 50),
    dict(LOADER, error="boom"),
    dict(LOADER, error=dict(ERROR, type=5)),
    dict(LOADER, error=dict(ERROR, at_ns=-1)),
])
def test_malformed_fields_are_bad_schema(loader):
    with pytest.raises(validate.Reject) as e:
        validate.parse(good(loader=loader))
    assert e.value.reason == "bad_schema"


@pytest.mark.parametrize("error", [
    dict(ERROR, message="x" * (errors.MAX_MESSAGE_CHARS + 1)),
    dict(ERROR, message="two\nlines"),
    dict(ERROR, type="T" * (errors.MAX_TYPE_CHARS + 1)),
    dict(ERROR, message="\ud800"),
])
def test_what_the_hook_would_have_bounded_or_stripped_is_refused_and_counted(error):
    table = state.RankTable()
    ing = ingest_of(table)
    assert not ing.handle(good(loader=dict(LOADER, error=error)))
    assert dict(ing.stats.rejected) == {"bad_loader_error": 1}
    assert table.snapshot() == []


def test_the_error_stays_with_the_process_and_the_batch_size_with_the_rank():
    table = state.RankTable()
    ing = ingest_of(table)
    assert ing.handle(good(loader=dict(LOADER, batch_bytes=1 << 20)))
    assert ing.handle(good(loader=dict(LOADER, error=ERROR)))
    assert ing.handle(good(loader=dict(LOADER)))  # a later report: no error, no size yet
    rank = table.snapshot()[0]
    assert rank.loader_error is not None and rank.loader_error.to_json() == ERROR
    assert rank.loader is not None and rank.loader.error is None
    assert rank.loader.batch_bytes == 1 << 20
    assert ing.handle(good(pid=4321, loader=dict(LOADER)))  # a new process: its own slate
    assert rank.loader_error is None
    json.dumps(rank.as_json(0.0))


def _errors(part):
    out = {}
    for f in part.collect():
        if f.name == "stallscope_loader_errors":
            for s in f.samples:
                out[(s.labels["pod"], s.labels["cause"])] = s.value
    return out


def test_the_pod_counts_each_process_once_by_the_cause_its_error_names():
    from stallscope.agent.parts.ranks import RanksPart

    table = state.RankTable()
    ing = ingest_of(table)
    part = RanksPart(None, table, ing.stats)
    assert ing.handle(good(loader=dict(LOADER)))
    assert _errors(part) == {("p", "shm_exhaustion"): 0, ("p", "other"): 0}  # each from 0
    assert ing.handle(good(loader=dict(LOADER, error=ERROR)))
    assert _errors(part) == {("p", "shm_exhaustion"): 1, ("p", "other"): 0}
    assert ing.handle(good(loader=dict(LOADER)))
    assert _errors(part)[("p", "shm_exhaustion")] == 1  # the same process: counted once
    timeout = {"type": "RuntimeError", "message": "DataLoader timed out after 5 seconds", "at_ns": 9}
    assert ing.handle(good(pid=4321, loader=dict(LOADER, error=timeout)))  # the rank restarted
    assert _errors(part) == {("p", "shm_exhaustion"): 1, ("p", "other"): 1}
