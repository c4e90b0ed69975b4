"""``stallscope compare A.json B.json``: two ``stallscope run`` reports side by side; B
regressed when its worst rank waits more than ``threshold`` (a share of step time) more
than A's."""
import json


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "report" not in doc:
        raise ValueError("%s is not a stallscope run report (no 'report' field)" % path)
    return doc["report"]


def _causes(body):
    return ", ".join(c["cause"] for c in body.get("causes") or []) or "-"


def compare(a_path, b_path, threshold, out):
    """Returns 0 (no regression) or 1 (B regressed past the threshold)."""
    a, b = load(a_path), load(b_path)
    rows = [("data-wait", "%.1f%%" % (100 * a["data_wait_ratio"]), "%.1f%%" % (100 * b["data_wait_ratio"])),
            ("compute/batch", "%.3fs" % (a.get("compute_seconds_per_batch") or 0),
             "%.3fs" % (b.get("compute_seconds_per_batch") or 0)),
            ("verdict", a.get("verdict"), b.get("verdict")),
            ("causes", _causes(a), _causes(b))]
    print("%-14s %-24s %-24s" % ("", "A", "B"), file=out)
    for name, x, y in rows:
        print("%-14s %-24s %-24s" % (name, x, y), file=out)
    delta = b["data_wait_ratio"] - a["data_wait_ratio"]
    regressed = delta > threshold
    print("%s: data-wait %+.1f points (threshold %.1f)" % (
        "REGRESSED" if regressed else "ok", 100 * delta, 100 * threshold), file=out)
    return 1 if regressed else 0
