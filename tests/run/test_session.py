"""`stallscope run` end to end on the README's example (examples/train.py): the live view
updates each second, the report names the injected cause, the HTML report renders in
headless Chromium with its plot and evidence table, the exit status is the training's,
Ctrl-C leaves no process and no file behind; `stallscope compare` gates on the reports."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from stallscope.processes.children import child_env
from tests.helpers import ROOT
from tests.helpers.frameworks import own_top_cause

EXAMPLE = os.path.join(ROOT, "examples", "train.py")


class Session:
    """`stallscope run ... -- python examples/train.py ARGS`, its output lines with the
    time each arrived."""

    def __init__(self, tmp, name, *args, ranks=1):
        self.json, self.html = str(tmp / (name + ".json")), str(tmp / (name + ".html"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stallscope", "run", "--ranks", str(ranks), "--json", self.json,
             "--html", self.html, "--", "python", EXAMPLE] + list(args),
            env=child_env({"OMP_NUM_THREADS": "1"}), cwd=str(tmp), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout=300):
        rc = self.proc.wait(timeout)
        self.reader.join(10)
        return rc

    def text(self):
        return "\n".join(s for _, s in self.lines)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A starved run (--slow: 60 ms a sample) and a fast one, side by side."""
    tmp = tmp_path_factory.mktemp("run")
    slow = Session(tmp, "slow", "--slow", "--batches", "45")
    fast = Session(tmp, "fast", "--batches", "45")
    try:
        codes = slow.wait(), fast.wait()
    finally:
        for s in (slow, fast):
            if s.proc.poll() is None:
                s.proc.kill()
    return {"slow": slow, "fast": fast, "codes": codes, "tmp": tmp}


@pytest.mark.slow
def test_run_shows_ranks_live_and_reports_the_injected_cause(reports):
    slow = reports["slow"]
    assert reports["codes"] == (0, 0), slow.text()[-3000:]
    live = [t for t, s in slow.lines if s.startswith("[") and "rank 0" in s]
    assert len(live) >= 5, slow.text()[-3000:]
    gaps = sorted(b - a for a, b in zip(live, live[1:]))
    # once a second; a 2-core machine under load delays a sleep now and then
    assert gaps[len(gaps) // 2] <= 1.2 and gaps[-1] < 3.0, gaps
    assert any("input_bound: " in s for _, s in slow.lines if s.startswith("[")), slow.text()[-2000:]
    with open(slow.json) as f:
        doc = json.load(f)
    assert doc["verdict"] == "input_bound", doc["reason"]
    assert own_top_cause(doc["causes"]) == "too_few_workers", doc["causes"]
    # 2 workers x 8 samples x 60 ms against 150 ms of compute: ~37 % of each step waits
    assert 0.25 < doc["data_wait_ratio"] < 0.95, doc["data_wait_ratio"]
    assert doc["run"]["exit_status"] == 0 and doc["run"]["ranks"][0]["batches"] >= 30
    assert "INPUT-BOUND" in slow.text() and "too_few_workers" in slow.text()


def _pixels_near(img, rgb, tol=14):
    import numpy as np

    px = np.asarray(img.convert("RGB"), dtype=np.int16)
    return int((np.abs(px - np.array(rgb, dtype=np.int16)) <= tol).all(axis=2).sum())


@pytest.mark.slow
def test_the_html_report_renders_its_plot_and_evidence_table_in_chromium(reports):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("needs Debian's chromium (scripts/install-system-deps)")
    from PIL import Image

    page = open(reports["slow"].html).read()
    assert "data:image/png;base64," in page and "http://" not in page and "<script" not in page
    shot = str(reports["tmp"] / "slow.png")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,1400", "--screenshot=" + shot, "file://" + reports["slow"].html],
                   check=True, timeout=120, capture_output=True)
    img = Image.open(shot)
    # the plot's data-wait fill (matplotlib's tab:red at alpha 0.45 on white) and the
    # tables' header rows (#1f4e79): both on screen, over areas no other element has
    assert _pixels_near(img, (236, 158, 158)) > 5000
    assert _pixels_near(img, (31, 78, 121), tol=6) > 3000


@pytest.mark.slow
def test_compare_exits_non_zero_when_b_regressed(reports, tmp_path):
    fast, slow = reports["fast"].json, reports["slow"].json

    def compare(a, b, *extra):
        return subprocess.run([sys.executable, "-m", "stallscope", "compare", a, b] + list(extra),
                              env=child_env(), text=True, capture_output=True, timeout=60)

    worse = compare(fast, slow)
    assert worse.returncode == 1 and "REGRESSED" in worse.stdout, worse.stdout
    assert "too_few_workers" in worse.stdout
    assert compare(slow, fast).returncode == 0
    assert compare(slow, slow).returncode == 0
    # a threshold above the measured difference lets it pass
    a, b = (json.load(open(p))["data_wait_ratio"] for p in (fast, slow))
    assert compare(fast, slow, "--threshold", "%.3f" % min(1.0, b - a + 0.01)).returncode == 0
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    out = compare(str(bad), slow)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a stallscope run report" in out.stderr
    assert "step time" in worse.stdout


@pytest.mark.slow
def test_exit_status_is_the_trainings(tmp_path):
    s = Session(tmp_path, "exit", "--batches", "3", "--exit-status", "3")
    assert s.wait() == 3, s.text()


def _processes_with(marker):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_ctrl_c_leaves_nothing_behind(tmp_path):
    tag = uuid.uuid4().hex
    s = Session(tmp_path, "interrupted", "--batches", "2000", "--tag", tag)
    try:
        deadline = time.monotonic() + 120
        while not any("rank 0" in line for _, line in s.lines):
            assert time.monotonic() < deadline and s.proc.poll() is None, s.text()
            time.sleep(0.2)
        workdir = s.lines[0][1].split(" in ")[1].split(" ")[0]
        assert os.path.isdir(workdir) and _processes_with(workdir)  # the agent, on its socket there
        s.proc.send_signal(signal.SIGINT)
        assert s.wait(60) == 130
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
    assert not os.path.exists(workdir)
    assert _processes_with(tag) == [] and _processes_with(workdir) == []


@pytest.mark.slow
def test_ranks_run_under_torchrun_and_the_worst_is_reported(tmp_path):
    s = Session(tmp_path, "two", "--slow", "--batches", "40", ranks=2)
    assert s.wait() == 0, s.text()[-3000:]
    with open(s.json) as f:
        doc = json.load(f)
    assert [r["rank"] for r in doc["run"]["ranks"]] == [0, 1], doc["run"]
    assert doc["verdict"] == "input_bound", doc["reason"]
    assert own_top_cause(doc["causes"]) == "too_few_workers", doc["causes"]
    # the report is the worst rank's, among both, over the report's own window
    assert doc["job_ranks"] == 2 and doc["data_wait_ratio"] == doc["job_max_data_wait_ratio"], doc
    live = {line.split("rank ")[1].split(" ")[0] for _, line in s.lines
            if line.startswith("[") and "rank " in line}
    assert live == {"0", "1"}, s.text()[-2000:]
