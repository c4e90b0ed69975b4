"""The live view of ``stallscope run``: one line per rank each interval (the run's elapsed
seconds, data-wait share, batches/s, batches so far, the current verdict), from the
embedded agent's API.

Every rank that reports to the run's private agent is followed, whatever its job name:
``stallscope.watch(loader, job="my-run")`` and the integrations' ``job=`` name the job
themselves, so asking only for the job that ``STALLSCOPE_JOB`` set lost them all (issue 34).

On a terminal the lines are redrawn in place, unless anything else reached the terminal
since the last draw (the training's output, relayed by terminal.py, marks the view
``dirty``): then they are appended below it, so a torchrun banner or a log line is never
overwritten. Elsewhere each update is printed."""
import collections
import json
import threading
import urllib.error
import urllib.parse
import urllib.request

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
    query = {"rank": rank, "job": job}
    if seconds is not None:
        query["seconds"] = "%g" % seconds
    return _get("%s/api/v1/diagnosis?%s" % (agent_url, urllib.parse.urlencode(query)))


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


def summary(key, entry, body):
    """The run's row for one rank: its batches so far (the agent's count), and the
    data-wait share and mean step of the correlator's window (``body``, the diagnosis)
    where it judged one, else of the rank's totals since it started."""
    job, rank = key
    body = body or {}
    n = int(entry.get("batches") or 0)
    windowed = body.get("data_wait_ratio") is not None and body.get("batches")
    if windowed:
        share, step, m = body["data_wait_ratio"], body.get("step_seconds") or 0.0, body["batches"]
    else:
        share, step, m = _totals_share(entry), entry.get("step_seconds_total") or 0.0, n
    return {"job": job, "rank": rank, "batches": n, "data_wait_ratio": share,
            "batches_per_second": m / step if step > 0 and m else None,
            "step_seconds_mean": step / m if m else None, "verdict": body.get("verdict"),
            "cause": ((body.get("causes") or [{}])[0]).get("cause")}


def line(row, rate, seconds, with_job=False):
    """``[   12s] rank 0  wait  37.2%    4.1 batch/s     48 batches  input_bound: too_few_workers``"""
    verdict = row["verdict"] or "unknown"
    if verdict == "input_bound" and row["cause"]:
        verdict += ": " + row["cause"]
    share = row["data_wait_ratio"]
    return "[%5.0fs] %srank %d  wait %s  %s batch/s  %6d batches  %s" % (
        seconds, "job %s " % row["job"] if with_job else "", row["rank"],
        "%5.1f%%" % (100 * share) if share is not None else "    - ",
        "%6.1f" % rate if rate is not None else "     -", row["batches"], verdict)


class View:
    """Draws the lines; ``dirty`` is set (under ``lock``) by whatever else writes to the
    same terminal, and makes the next draw append instead of redrawing in place."""

    def __init__(self, out):
        self.out = out
        self.tty = getattr(out, "isatty", lambda: False)()
        self.drawn = 0
        self.dirty = False
        self.mid_line = False  # what else was written ended inside a line (a progress bar)
        self.lock = threading.Lock()

    def show(self, seconds, rows, rates):
        with_job = len({r["job"] for r in rows}) > 1
        lines = [line(r, rates.get((r["job"], r["rank"])), seconds, with_job) for r in rows] or \
            ["[%5.0fs] no batches yet" % seconds]
        with self.lock:
            if self.tty:
                up = "\x1b[%dF" % self.drawn if self.drawn and not self.dirty else ""
                # below a line left open (tqdm's bar), not over it
                up = "\n" if self.dirty and self.mid_line else up
                self.out.write(up + "".join("\x1b[2K%s\n" % s for s in lines))
                self.drawn = len(lines)
                self.dirty = self.mid_line = False
            else:
                self.out.write("".join("%s\n" % s for s in lines))
            self.out.flush()
