"""The live view of ``stallscope run``: one line per rank each second (data-wait share,
batches/s, the current verdict), from the embedded agent's API. On a terminal the lines
are redrawn in place; otherwise each update is printed, stamped with the run's seconds."""
import json
import urllib.error
import urllib.request


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def ranks(agent_url, job):
    body = _get(agent_url + "/api/v1/ranks") or {}
    return sorted({r["rank"] for r in body.get("ranks", []) if r.get("job") == job})


def diagnosis(agent_url, job, rank):
    return _get("%s/api/v1/diagnosis?rank=%d&job=%s" % (agent_url, rank, job))


def summary(rank, body):
    step = body.get("step_seconds") or 0.0
    n = body.get("batches") or 0
    return {"rank": rank, "batches": n, "data_wait_ratio": body.get("data_wait_ratio"),
            "batches_per_second": n / step if step > 0 else None,
            "step_seconds_mean": step / n if n else None, "verdict": body.get("verdict"),
            "cause": ((body.get("causes") or [{}])[0]).get("cause")}


def line(rank, body):
    """``rank 0  wait  37.2%    4.1 batch/s  input_bound: too_few_workers``"""
    s = summary(rank, body)
    verdict = s["verdict"] or "unknown"
    if verdict == "input_bound" and s["cause"]:
        verdict += ": " + s["cause"]
    return "rank %d  wait %5.1f%%  %6.1f batch/s  %s" % (
        rank, 100 * (s["data_wait_ratio"] or 0), s["batches_per_second"] or 0, verdict)


class View:
    def __init__(self, out):
        self.out = out
        self.tty = getattr(out, "isatty", lambda: False)()
        self.drawn = 0

    def show(self, seconds, bodies):
        lines = [line(r, bodies[r]) for r in sorted(bodies)] or ["no batches yet"]
        if self.tty:
            up = "\x1b[%dF" % self.drawn if self.drawn else ""
            self.out.write(up + "".join("\x1b[2K%s\n" % s for s in lines))
            self.drawn = len(lines)
        else:
            self.out.write("".join("[%5.0fs] %s\n" % (seconds, s) for s in lines))
        self.out.flush()
