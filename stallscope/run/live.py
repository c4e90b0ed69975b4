"""The live view of ``stallscope run``: one line per rank each interval (the run's elapsed
seconds, data-wait share, batches/s, batches so far, the current verdict), from the
embedded agent's API.

Every rank that reports to the run's private agent is followed, whatever its job name:
``stallscope.watch(loader, job="my-run")`` and the integrations' ``job=`` name the job
themselves, so asking only for the job that ``STALLSCOPE_JOB`` set lost them all (issue 34).

On a terminal the lines hold the bottom rows of the screen, fitted to its width, and the
training's output (relayed by terminal.py) scrolls above them (View). Elsewhere each
update is printed."""
import collections
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request

from ..correlate import codec
from .outcome import RankRow

RATE_WINDOW_S = 5.0    # batches/s over the last few seconds of counts ...
RATE_HISTORY_S = 60.0  # ... or longer when no batch came in those (slow steps)


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def ranks(agent_url):
    """{(job, rank): the agent's /api/v1/ranks entry} for every rank it tracks (the agent
    is the run's own: whatever reports to it is this run's)."""
    body = _get(agent_url + "/api/v1/ranks") or {}
    return {(str(r.get("job")), r["rank"]): r for r in body.get("ranks") or []
            if isinstance(r, dict) and isinstance(r.get("rank"), int)}


def diagnosis(agent_url, job, rank, seconds=None):
    """The correlator's Diagnosis of one rank (decoded by its one codec where the answer
    enters), or None when the agent has none or answers something else."""
    query = {"rank": rank, "job": job}
    if seconds is not None:
        query["seconds"] = "%g" % seconds
    body = _get("%s/api/v1/diagnosis?%s" % (agent_url, urllib.parse.urlencode(query)))
    if body is None:
        return None
    try:
        return codec.decode(body)
    except codec.Malformed:
        return None


def step_seconds(d):
    """The window's step time of a Diagnosis (0 when it has no loop numbers)."""
    return d.loop.step_seconds if d is not None and d.loop is not None else 0.0


class Rates:
    """Batches/s per rank from the agent's batch counts as they grow: over the last
    RATE_WINDOW_S or more. Before that much history, or while the next batch is not
    overdue (slow steps), the rank's mean rate since it started (its batches over the
    sum of its step intervals): a rank making batches never shows 0 batch/s, which the
    correlator's window did while it had fewer than MIN_BATCHES. 0 only once no batch
    came for RATE_WINDOW_S and three of its mean steps."""

    def __init__(self):
        self.seen = collections.defaultdict(collections.deque)

    def add(self, key, t, entry):
        h = self.seen[key]
        h.append((t, int(entry.get("batches") or 0)))
        while h and t - h[0][0] > RATE_HISTORY_S:
            h.popleft()

    def rate(self, key, entry):
        h = self.seen.get(key)
        n = int(entry.get("batches") or 0)
        step = entry.get("step_seconds_total") or 0.0
        if not h or not n:
            return None
        t = h[-1][0]
        back = [(t0, n0) for t0, n0 in h if t - t0 >= RATE_WINDOW_S]
        if back and back[-1][1] < n:
            t0, n0 = back[-1]
            return (n - n0) / (t - t0)
        since = min(t0 for t0, n0 in h if n0 == n)  # first seen at this count
        mean_interval = step / n if step > 0 else 0.0
        if t - since > max(RATE_WINDOW_S, 3 * mean_interval):
            return 0.0
        return n / step if step > 0 else None


def _totals_share(entry):
    step = entry.get("step_seconds_total") or 0.0
    return (entry.get("data_wait_seconds_total") or 0.0) / step if step > 0 else None


def summary(key, entry, diag):
    """The run's row for one rank: its batches so far (the agent's count), and the
    data-wait share and mean step of the correlator's window (``diag``, its Diagnosis)
    where it judged one, else of the rank's totals since it started."""
    job, rank = key
    n = int(entry.get("batches") or 0)
    if diag is not None and diag.data_wait_ratio is not None and diag.batches:
        share, step, m = diag.data_wait_ratio, step_seconds(diag), diag.batches
    else:
        share, step, m = _totals_share(entry), entry.get("step_seconds_total") or 0.0, n
    return RankRow(job, rank, n, share, batches_per_second=m / step if step > 0 and m else None,
                   step_seconds_mean=step / m if m else None,
                   verdict=diag.verdict if diag is not None else None,
                   cause=diag.causes[0].cause if diag is not None and diag.causes else None)


def line(row, rate, seconds, with_job=False):
    """``[  12s] rank 0 wait 37.2% 4.1 batch/s 48 batches input_bound: too_few_workers``
    (under 80 columns for a rank with a cause: issue 52, the ~90-character line wrapped)."""
    verdict = row.verdict or "unknown"
    if verdict == "input_bound" and row.cause:
        verdict += ": " + row.cause
    share = row.data_wait_ratio
    return "[%4.0fs] %srank %d wait %s %s batch/s %d batches %s" % (
        seconds, "job %s " % row.job if with_job else "", row.rank,
        "%.1f%%" % (100 * share) if share is not None else "-",
        "%.1f" % rate if rate is not None else "-", row.batches, verdict)


def fit(lines, columns, rows):
    """The lines cut to the terminal's width less one column (a line as wide as the
    terminal wraps on some terminals, and each redraw then adds a line: issue 52), and
    to a third of its height at most: the worst ranks first, then how many more."""
    most = max(1, rows // 3)
    if len(lines) > most:
        lines = lines[:most - 1] + ["... and %d more ranks" % (len(lines) - most + 1)]
    width = max(10, columns - 1)
    return [s if len(s) <= width else s[:width - 3] + "..." for s in lines]


def _terminal_size(out):
    try:
        size = os.get_terminal_size(out.fileno())
        return size.columns, size.lines
    except (OSError, ValueError, AttributeError):
        return 80, 24


class View:
    """Draws the lines. On a terminal they hold the bottom rows of the screen, below a
    scroll region that the training's output (relayed by terminal.py) scrolls in, as
    apt's progress line does: whatever the training draws (a tqdm, rich or Lightning
    progress bar redrawn in place, nested bars, log lines) moves the cursor within its
    region only, so a redraw of the view never lands on a bar, freezes one, or adds a
    line (issue 52: under a bar, a frozen bar and a status line every second). The view
    draws between the training's writes (under ``lock``) and never inside one of its
    escape sequences (``open_escape``, set by the relay). Elsewhere each update is
    printed."""

    def __init__(self, out, size=None):
        self.out = out
        self.tty = getattr(out, "isatty", lambda: False)()
        self.size = size or (lambda: _terminal_size(out))
        self.lock = threading.Lock()
        self.open_escape = False   # the training's output ends inside an escape sequence
        self.reserved = 0          # the rows the view holds at the bottom of the screen
        self.screen = None         # (columns, rows) the region was set for
        self.on_region = None      # told (columns, rows) of the training's region (terminal.py)

    def show(self, seconds, rows, rates):
        with_job = len({r.job for r in rows}) > 1
        rows = sorted(rows, key=lambda r: -(r.data_wait_ratio or 0.0)) if len(rows) > 3 else rows
        lines = [line(r, rates.get((r.job, r.rank)), seconds, with_job) for r in rows] or \
            ["[%4.0fs] no batches yet" % seconds]
        with self.lock:
            if not self.tty:
                self.out.write("".join("%s\n" % s for s in lines))
                self.out.flush()
                return
            if self.open_escape:
                return  # inside the training's escape sequence: the next update draws
            columns, height = self.size()
            lines = fit(lines, columns, height)
            buf = self._reserve(len(lines), columns, height)
            top = height - self.reserved + 1
            buf += "\x1b7" + "".join("\x1b[%d;1H\x1b[2K%s" % (top + i, s) for i, s in enumerate(lines))
            buf += "".join("\x1b[%d;1H\x1b[2K" % r for r in range(top + len(lines), height + 1)) + "\x1b8"
            self.out.write(buf)
            self.out.flush()

    def _reserve(self, n, columns, height):
        """The controls that make the bottom ``n`` rows the view's (or keep them): the
        screen scrolled up to make room, the scroll region set above them, the cursor
        back where the training left it (moved up with its text)."""
        if n <= self.reserved and self.screen == (columns, height):
            return ""
        n = max(n, self.reserved) if self.screen == (columns, height) else n
        grow = n - self.reserved if self.screen == (columns, height) else n
        buf = "\x1b7\x1b[r"  # save the cursor; the whole screen scrolls again
        buf += "\x1b[%d;1H" % height + "\n" * grow  # room at the bottom: the text moves up
        buf += "\x1b[1;%dr" % max(1, height - n) + "\x1b8"
        if grow:
            buf += "\x1b[%dA" % grow  # the cursor follows its text
        self.reserved, self.screen = n, (columns, height)
        if self.on_region:
            self.on_region(columns, max(1, height - n))
        return buf

    def close(self):
        """The training has ended: the screen scrolls whole again and the cursor goes
        below the view's last lines, where the report follows."""
        with self.lock:
            if self.tty and self.reserved and self.screen:
                self.out.write("\x1b7\x1b[r\x1b8\x1b[%d;1H\n" % self.screen[1])
                self.out.flush()
            self.reserved, self.screen = 0, None
