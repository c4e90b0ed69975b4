"""diagnose shows the agent's set-up warnings and the loader's own error (issue 32), and
says the checks are not known where no agent answered."""
import json

from stallscope.correlate import checks, loader_errors
from stallscope.diagnose import render, report
from stallscope.diagnose.document import encode
from stallscope.report import LoaderSettings, ReportedError
from tests.helpers.diagnose import cause, diagnosis
from tests.helpers.diagnose import report as make_report

MiB = 1 << 20
SHM_ERROR = {"type": "RuntimeError", "at_ns": 5, "message": (
    "Caught RuntimeError in DataLoader worker process 0. Original Traceback (most recent call "
    "last): ... RuntimeError: unable to allocate shared memory(shm) for file </torch_1_2>: No "
    "space left on device (28)")}
LOADER = LoaderSettings(num_workers=2, prefetch_factor=2, batch_bytes=6 * MiB, pin_memory=False)


def test_a_failed_shm_allocation_is_shm_exhaustion_with_the_size_that_is_enough():
    e = loader_errors.judge(ReportedError(**SHM_ERROR), LOADER, 16 * MiB)
    assert e.cause == "shm_exhaustion" and e.needed_bytes == 2 * 2 * 6 * MiB
    assert "24.0 MiB" in e.text and "16.0 MiB" in e.text


def test_other_errors_are_shown_as_they_came_and_name_no_cause():
    e = loader_errors.judge(ReportedError("RuntimeError", "DataLoader timed out after 5 seconds"),
                            LOADER)
    assert e.cause is None and "timed out" in e.text
    killed = loader_errors.judge(ReportedError(
        "RuntimeError", "DataLoader worker (pid 7) is killed by signal: Bus error. "), LOADER)
    assert killed.cause == "shm_exhaustion"


def _doc(diag):
    return report._with_setup(make_report(verdict="unknown"), diag)


def test_the_report_shows_the_warnings_and_the_error_cause_leads():
    warned, _ = checks.evaluate(checks.SetUp(LOADER, gpu=True, shm_size_bytes=16 * MiB))
    err = loader_errors.judge(ReportedError(**SHM_ERROR), LOADER, 16 * MiB)
    d = diagnosis("unknown", warnings=warned, loader_error=err,
                  causes=(cause("unexplained", 0.2), cause("shm_exhaustion", 1.0)))
    doc = _doc(d)
    assert [c.cause for c in doc.causes][:1] == ["shm_exhaustion"] or not doc.causes
    text = render.render_text(doc)
    assert "Set-up warnings" in text and "shm_too_small" in text and "pin_memory_off_with_gpu" in text
    assert "Loader error: The loader failed to allocate a batch in /dev/shm" in text
    body = json.loads(json.dumps(encode(doc)))
    assert {w["check"] for w in body["setup_warnings"]} == {"shm_too_small", "pin_memory_off_with_gpu"}
    assert body["loader_error"]["cause"] == "shm_exhaustion"
    assert body["loader_error"]["needed_bytes"] == 24 * MiB


def test_without_an_agent_the_checks_are_said_to_be_unknown():
    doc = _doc(None)
    assert doc.setup_warnings == () and "not known" in doc.checks_note
    assert report.CHECKS_UNKNOWN in render.render_text(doc)
