"""The live view of `stallscope run` on a terminal: a pseudo-terminal stands in for the
user's, and a small screen model (the three controls the view writes: CR, LF, erase
line and cursor up) replays what reached it. The training's own lines must all be on the
screen at the end (issue 34: the in-place redraw overwrote them), and the view still
redraws in place while nothing else is written. And the batch rate from the agent's
counts, which must not read 0 while batches flow."""
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
_CONTROL = re.compile(r"\x1b\[(\d*)([A-Za-z])|\r|\n|[^\x1b\r\n]+")


def screen(text):
    """The lines a terminal shows after ``text`` (no scrolling limit)."""
    rows, y, x = [""], 0, 0
    for m in _CONTROL.finditer(text):
        s = m.group(0)
        if s == "\n":
            y, x = y + 1, 0
            if y == len(rows):
                rows.append("")
        elif s == "\r":
            x = 0
        elif m.group(2) == "F":  # cursor up N lines, to their start
            y, x = max(0, y - int(m.group(1) or 1)), 0
        elif m.group(2) == "K" and m.group(1) == "2":
            rows[y] = ""
        elif m.group(2) is None:
            rows[y] = rows[y][:x].ljust(x) + s + rows[y][x + len(s):]
            x += len(s)
    return [r for r in rows]


def test_the_screen_model_replays_an_in_place_redraw():
    assert screen("a\nb\n\x1b[1F\x1b[2Kc\n") == ["a", "c", ""]
    assert screen("one\r\ntwo\r\n") == ["one", "two", ""]


@pytest.mark.slow
def test_lines_the_training_prints_between_redraws_stay_on_the_screen(tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stallscope", "run", "--interval", "0.5", "--json",
         str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), "--", "python", EXAMPLE,
         "--slow", "--batches", "30", "--log-every", "6"],
        env=child_env({"OMP_NUM_THREADS": "1"}), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
        stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []

    def read():
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                return
            if not b:
                return
            chunks.append(b)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert proc.wait(300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    rows = screen(text)
    logs = [r.strip() for r in rows if r.startswith("train: batch")]
    assert logs == ["train: batch %d" % i for i in range(0, 30, 6)], rows
    live_rows = [r for r in rows if r.startswith("[") and "rank 0" in r]
    draws = text.count("rank 0  wait")
    # appended after each log line, redrawn in place otherwise: fewer rows than draws
    assert 5 <= len(live_rows) < draws, (len(live_rows), draws, rows)
    last = live_rows[-1]
    assert re.match(r"\[\s*\d+s\] rank 0 .* 30 batches ", last), last
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


class _Terminal:
    """What the view writes, as a terminal would show it (isatty true)."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_the_view_redraws_in_place_appends_after_other_output_and_keeps_an_open_line():
    term = _Terminal()
    view = live.View(term)
    row = {"job": "j", "rank": 0, "batches": 5, "data_wait_ratio": 0.1, "verdict": None, "cause": None}
    view.show(1.0, [row], {})
    view.show(2.0, [dict(row, batches=9)], {})
    assert [r for r in screen(term.text) if r] == [live.line(dict(row, batches=9), None, 2.0)]
    with view.lock:  # as the relay does: a log line, then a progress bar with no newline
        term.write("log: epoch 1\n")
        view.dirty, view.mid_line = True, False
    view.show(3.0, [dict(row, batches=12)], {})
    with view.lock:
        term.write("\r 40%|####      |")
        view.dirty, view.mid_line = True, True
    view.show(4.0, [dict(row, batches=15)], {})
    shown = [r for r in screen(term.text) if r]
    assert shown == [live.line(dict(row, batches=9), None, 2.0), "log: epoch 1",
                     live.line(dict(row, batches=12), None, 3.0), " 40%|####      |",
                     live.line(dict(row, batches=15), None, 4.0)], shown
