"""``stallscope compare A.json B.json``: two ``stallscope run`` reports (diagnose's
document of the worst rank plus the run's ranks) side by side. B regressed when its
worst rank's data-wait share exceeds A's by more than ``threshold`` (a share of step
time, like the alert line): the loop spends that much more of each step waiting."""
import json


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError as e:
        raise ValueError("%s is not JSON: %s" % (path, e)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("run"), dict) or \
            not isinstance(doc.get("data_wait_ratio"), (int, float)):
        raise ValueError("%s is not a stallscope run report (no 'run' and 'data_wait_ratio')" % path)
    return doc


def step_seconds(doc):
    """The worst rank's mean interval between batches: its step time."""
    for r in doc["run"].get("ranks") or []:
        if r.get("rank") == doc.get("rank"):
            return r.get("step_seconds_mean")
    return None


def _causes(doc):
    named = [c["cause"] for c in doc.get("causes") or [] if c.get("score", 0) > 0]
    return ", ".join(named[:3]) or "-"


def _s(v):
    return "%.3fs" % v if v is not None else "n/a"


def compare(a_path, b_path, threshold, out):
    """Returns 0 (no regression) or 1 (B regressed past the threshold)."""
    a, b = load(a_path), load(b_path)
    rows = [("data-wait", "%.1f%%" % (100 * a["data_wait_ratio"]), "%.1f%%" % (100 * b["data_wait_ratio"])),
            ("step time", _s(step_seconds(a)), _s(step_seconds(b))),
            ("verdict", a.get("verdict"), b.get("verdict")),
            ("causes", _causes(a), _causes(b)),
            ("exit status", a["run"].get("exit_status"), b["run"].get("exit_status"))]
    width = max(24, max(len(str(x)) for _, x, _ in rows) + 2)
    print("%-12s %-*s %s" % ("", width, "A " + a_path, "B " + b_path), file=out)
    for name, x, y in rows:
        print("%-12s %-*s %s" % (name, width, x, y), file=out)
    delta = b["data_wait_ratio"] - a["data_wait_ratio"]
    regressed = delta > threshold
    print("%s: B's data-wait is %+.1f points against A's (threshold %.1f)" % (
        "REGRESSED" if regressed else "ok", 100 * delta, 100 * threshold), file=out)
    return 1 if regressed else 0


def main(a_path, b_path, threshold, out, err):
    """The command's exit status: compare's, or 2 with one line on ``err`` when a file
    is not a run report."""
    try:
        return compare(a_path, b_path, threshold, out)
    except (ValueError, KeyError) as e:
        print("stallscope compare: %s" % e, file=err)
        return 2
