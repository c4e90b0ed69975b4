"""The live view in an ordinary terminal (issue 52, item 4): 80 columns, a real tqdm
progress bar (and log lines) written by a real child process through the real relay
(terminal.py), the view redrawn between its writes; a VT100 emulator (pyte) shows the
screen as the user sees it; the same under rich's live progress display. No status
line wraps, the bar is on one row only (no frozen copies), the view's lines do not pile
up, and the child's log lines all stay."""
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from stallscope.run import live, terminal
from stallscope.run.outcome import RankRow

pyte = pytest.importorskip("pyte")
COLUMNS, ROWS = 80, 24

CHILDREN = {
    "tqdm": r"""
import sys, time
from tqdm import tqdm
for i in tqdm(range(40), desc="train", mininterval=0.05):
    time.sleep(0.05)
    if i % 10 == 0:
        tqdm.write("log: step %d" % i)
print("done", flush=True)
""",
    # rich's live display redraws with cursor-up controls (Lightning's RichProgressBar)
    "rich": r"""
import time
from rich.progress import Progress
with Progress(refresh_per_second=20) as p:
    task = p.add_task("train:", total=40)
    for i in range(40):
        time.sleep(0.05)
        if i % 10 == 0:
            p.console.print("log: step %d" % i)
        p.advance(task)
print("done", flush=True)
""",
}


class _Terminal:
    """A pseudo-terminal of COLUMNS x ROWS; what reaches it is fed to a pyte screen."""

    def __init__(self):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.out = os.fdopen(slave, "w", buffering=1)
        self.screen = pyte.HistoryScreen(COLUMNS, ROWS, history=1000)
        self.stream = pyte.ByteStream(self.screen)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while True:
            try:
                b = os.read(self.master, 65536)
            except OSError:
                return
            if not b:
                return
            self.stream.feed(b)

    def lines(self):
        """Everything on screen and scrolled off it, top to bottom, right-stripped."""
        above = ["".join(c.data for c in row.values()).rstrip() for row in self.screen.history.top]
        return above + [r.rstrip() for r in self.screen.display]

    def close(self):
        self.out.close()
        self.thread.join(5)
        os.close(self.master)


def _row(rank, n):
    return RankRow("j", rank, n, 0.372, verdict="input_bound", cause="too_few_workers")


@pytest.mark.parametrize("bar", sorted(CHILDREN))
def test_the_view_stays_below_a_progress_bar_at_80_columns(bar):
    pytest.importorskip(bar)
    term = _Terminal()
    view = live.View(term.out)
    relay = terminal.Relay(view, stderr_too=True)
    child = subprocess.Popen([sys.executable, "-c", CHILDREN[bar]], **relay.popen_kwargs())
    relay.started()
    t0 = time.monotonic()
    draws = 0
    while child.poll() is None:
        view.show(time.monotonic() - t0, [_row(0, draws), _row(1, draws)], {("j", 0): 4.1, ("j", 1): 3.9})
        draws += 1
        time.sleep(0.1)
    relay.close()
    view.show(time.monotonic() - t0, [_row(0, draws), _row(1, draws)], {})
    view.close()
    term.out.write("report\n")
    time.sleep(0.3)
    lines = term.lines()
    term.close()
    text = "\n".join(lines)
    assert draws >= 10, draws
    status = [s for s in lines if s.startswith("[") and " rank " in s]
    # one line per rank at the end, none piled up, none wrapped (no line is a status's tail)
    assert len(status) == 2, text
    assert all(len(s) < COLUMNS for s in status) and "too_few_workers" in status[0], status
    assert not [s for s in lines if s.startswith(("ew_workers", "workers", "ers"))], text
    # the bar: on one row (its final state), never frozen on several
    bars = [s for s in lines if s.startswith("train:")]
    assert len(bars) == 1 and ("40/40" in bars[0] or "100%" in bars[0]), text
    logs = [s for s in lines if s.startswith("log: step")]
    assert logs == ["log: step %d" % i for i in (0, 10, 20, 30)], text
    assert "done" in lines
    # the view's last lines, then the report below them
    assert lines.index("report") > lines.index(status[-1]), text


def test_lines_are_cut_to_the_width_and_many_ranks_summed_up():
    rows = [live.line(_row(r, 10), 4.0, 12.0) for r in range(20)]
    assert len(rows[0]) < 80  # a rank with its cause fits 80 columns
    fitted = live.fit(rows, 40, 24)
    assert len(fitted) == 8 and fitted[-1] == "... and 13 more ranks"
    assert all(len(s) <= 39 for s in fitted), fitted


def test_an_escape_sequence_split_across_writes_holds_the_view_back():
    assert terminal.open_escape("bar \x1b[") == "\x1b["
    assert terminal.open_escape("bar \x1b[2") == "\x1b[2"
    assert terminal.open_escape("bar \x1b[2K") == ""
    assert terminal.open_escape("\x1b]0;title\x07 ok") == ""
    assert terminal.open_escape("\x1b]0;tit") == "\x1b]0;tit"
    assert terminal.open_escape("plain \r 40%|###") == ""
