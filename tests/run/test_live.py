"""The live view of `stallscope run` on a terminal: a pseudo-terminal stands in for the
user's, and a VT100 emulator (pyte) shows what reached it. The training's own lines must
all be on the screen at the end (issue 34: the in-place redraw overwrote them), and the
view stays one line a rank under a progress bar (issue 52; tests/run/test_terminal.py
for the relay alone). And the batch rate from the agent's counts, which must not read 0
while batches flow."""
import os
import pty
import re
import subprocess
import sys
import threading

import pytest

from stallscope.processes.children import child_env
from stallscope.run import live
from tests.helpers import ROOT

EXAMPLE = os.path.join(ROOT, "examples", "train.py")


@pytest.mark.slow
def test_lines_the_training_prints_between_redraws_stay_on_the_screen(tmp_path):
    """`stallscope run` in a pseudo-terminal of 80 x 24 (a VT100 emulator, pyte, shows the
    screen), the training printing a log line every 6 batches under a tqdm bar: every log
    line stays, the bar is on one row (none frozen), the view is one line (none piled up,
    none wrapped), redrawn in place; its last draw saw all 30 batches."""
    pyte = pytest.importorskip("pyte")
    pytest.importorskip("tqdm")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope", "run", "--interval", "0.5", "--json",
         str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), "--", "python", EXAMPLE,
         "--slow", "--batches", "30", "--log-every", "6", "--progress"],
        env=child_env({"OMP_NUM_THREADS": "1"}), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
        stdout=slave, stderr=slave)
    os.close(slave)
    screen = pyte.HistoryScreen(80, 24, history=2000)
    stream = pyte.ByteStream(screen)
    raw = []

    def read():
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                return
            if not b:
                return
            raw.append(b)
            stream.feed(b)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert proc.wait(300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    os.close(master)
    rows = ["".join(c.data for c in r.values()).rstrip() for r in screen.history.top]
    rows += [r.rstrip() for r in screen.display]
    text = "\n".join(rows)
    logs = [r.strip() for r in rows if r.startswith("train: batch")]
    assert logs == ["train: batch %d" % i for i in range(0, 30, 6)], text
    live_rows = [r for r in rows if r.startswith("[") and "rank 0" in r]
    draws = b"".join(raw).count(b"rank 0 wait")
    assert draws >= 5 and len(live_rows) == 1, (draws, text)
    assert re.match(r"\[\s*\d+s\] rank 0 .* 30 batches ", live_rows[0]), live_rows
    assert all(len(r) < 80 for r in live_rows)
    bars = [r for r in rows if r.startswith("train:") and "|" in r]
    assert len(bars) == 1, text
    assert os.path.exists(tmp_path / "r.json")


def _entry(batches, step_total):
    return {"batches": batches, "step_seconds_total": step_total}


def test_the_rate_reads_the_mean_before_there_is_a_window_and_never_0_while_batches_come():
    rates = live.Rates()
    key = ("j", 0)
    assert rates.rate(key, _entry(0, 0.0)) is None  # not reported yet
    # the hook reports once a second: two polls can see the same count
    # (4 batches/s, 0.25 s a step)
    seen = [(1.0, 4), (2.0, 4), (3.0, 12), (4.0, 16), (5.0, 16), (6.0, 24), (7.0, 28)]
    for t, n in seen:
        rates.add(key, t, _entry(n, 0.25 * n))
        r = rates.rate(key, _entry(n, 0.25 * n))
        assert r is not None and 3.0 <= r <= 5.0, (t, r)
    # stopped: no batch for 5 s and three mean steps -> 0
    for t in (8.0, 9.0, 10.0, 11.0, 12.5):
        rates.add(key, t, _entry(28, 7.0))
    assert rates.rate(key, _entry(28, 7.0)) == 0.0


def test_slow_steps_are_not_read_as_stopped():
    """One batch every 8 s: a 5 s window often has none; the rank still makes batches."""
    rates = live.Rates()
    key = ("j", 0)
    n = 0
    for t in range(1, 41):
        if t % 8 == 0:
            n += 1
        rates.add(key, float(t), _entry(n, 8.0 * n))
        if n:
            r = rates.rate(key, _entry(n, 8.0 * n))
            assert r is not None and 0.08 <= r <= 0.25, (t, r)


def test_the_plot_spreads_waits_over_bins_and_its_running_mean_trails_them():
    from stallscope.run import plot

    # a wait of 0.5 s ending at 1.0 s and one of 0.25 s ending at 2.0 s, on 0.5 s bins
    batches = [{"t_end_ns": 1_000_000_000, "wait_ns": 500_000_000},
               {"t_end_ns": 2_000_000_000, "wait_ns": 250_000_000}]
    x, share, t0 = plot.shares(batches, 0.5)
    assert t0 == 500_000_000 and list(x) == [0.0, 0.5, 1.0]
    assert [round(v, 6) for v in share] == [1.0, 0.0, 0.5]
    mean = plot.running_mean(share, 0.5, mean_s=1.0)  # two bins
    assert [round(v, 6) for v in mean] == [1.0, 0.5, 0.25]
