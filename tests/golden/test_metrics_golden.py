"""The agent's /metrics over a fixed fake /proc, /sys, cgroup tree and root filesystem
(fixtures/), fed fixed hook reports, against the checked-in exposition (metrics.prom),
and linted by ``promtool check metrics``, as node_exporter does with its end-to-end
fixture. ``pytest tests/golden --update`` rewrites metrics.prom and signals.txt.

The scenario and what is masked (and why) are in tests/helpers/golden.py."""
import difflib
import os
import shutil
import subprocess

import pytest

from tests.helpers import golden

# promtool findings the vocabulary has today, each a known design question left to its
# owner rather than papered over here; a new finding fails, and so does a fixed one
# still listed (remove it then).
KNOWN_LINT: set = set()  # promtool findings accepted here, each with why (none today)


@pytest.fixture(scope="module")
def run():
    return golden.golden_run()


@pytest.fixture
def update(request):
    return request.config.getoption("--update")


def compare(path, text, run, update):
    if update:
        if run.failures:
            pytest.fail("not rewriting %s: parts failed to collect: %s" % (path, run.failures))
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        expected = f.read()
    if text != expected:
        name = os.path.relpath(path)
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            name, "this run", n=1))
        failed = "".join("\n  - %s" % f for f in run.failures)
        pytest.fail("%s differs from this run (if the change is intended: pytest tests/golden "
                    "--update, and review the diff)%s\n%s" % (
                        name, "; parts failed to collect:" + failed if failed else "", diff),
                    pytrace=False)


def test_metrics_match_the_golden_exposition(run, update):
    if not run.exact:
        pytest.skip(run.inexact_why)
    compare(golden.GOLDEN_METRICS, golden.masked(run.exposition), run, update)


def test_recorded_signals_match_the_golden_table(run, update):
    compare(golden.GOLDEN_SIGNALS, golden.signals_table(run), run, update)


def test_promtool_finds_no_problem_in_the_exposition(run):
    if not shutil.which("promtool"):
        pytest.skip("needs promtool (apt-get install prometheus)")
    done = subprocess.run(["promtool", "check", "metrics"], input=run.exposition,
                          capture_output=True, text=True, timeout=60)
    found = {line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()}
    assert done.returncode in ((0,) if not found else (0, 3)), (done.returncode, found)
    assert sorted(found - KNOWN_LINT) == [], "promtool check metrics found problems"
    assert sorted(KNOWN_LINT - found) == [], "fixed: remove these from KNOWN_LINT"
