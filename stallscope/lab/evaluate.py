"""The correlator's labelled evaluation set: a confusion table of expected vs found.

    python -m stallscope.lab.evaluate [DIR] [--check] [--json]
    python -m stallscope.lab.evaluate --write-synthetic [DIR]

DIR defaults to tests/data/traces (lab/traces.py). Each trace is diagnosed exactly as the
agent would (its peers are the job's other ranks on the node); a row is OK when the
verdict matches and the top-ranked cause is the expected one (no causes at all for
healthy and not_input_bound). ``--check`` exits 1 on any miss.
"""
import argparse
import collections
import json
import os
import sys

from ..correlate import diagnosis
from ..correlate.trace import RankTrace
from . import traces


def diagnose(doc):
    trace = RankTrace.from_timeline(doc["timeline"])
    peers = [RankTrace.from_timeline(p) for p in doc.get("peers") or ()]
    node = (doc["timeline"].get("rank") or {}).get("node", "")
    return diagnosis.analyse(trace, peers + [trace], node=node,
                             window_seconds=doc["timeline"].get("seconds"))


def row(path, doc):
    labels = doc["labels"]
    d = diagnose(doc)
    top = d.causes[0] if d.causes else None
    want_cause = labels.get("expected_cause")
    ok = d.verdict == labels["expected_verdict"] and (
        (top is None and want_cause is None) or (top is not None and top.cause == want_cause))
    return {"file": os.path.basename(path), "scenario": labels["scenario"],
            "source": labels.get("source", "?"), "expected_verdict": labels["expected_verdict"],
            "verdict": d.verdict, "expected_cause": want_cause,
            "top_cause": top.cause if top else None,
            "score": top.score if top else None,
            "second": "%s %.2f" % (d.causes[1].cause, d.causes[1].score)
            if len(d.causes) > 1 else "", "ok": ok}


def table(rows):
    head = ("scenario", "source", "expected verdict", "verdict", "expected cause",
            "top cause", "score", "runner-up", "ok")
    lines = [[r["scenario"], r["source"], r["expected_verdict"], r["verdict"],
              r["expected_cause"] or "-", r["top_cause"] or "-",
              "-" if r["score"] is None else "%.2f" % r["score"], r["second"] or "-",
              "OK" if r["ok"] else "MISS"] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    out = [fmt % head, fmt % tuple("-" * w for w in widths)] + [fmt % tuple(line) for line in lines]
    confusion = collections.Counter((r["expected_cause"] or "(none)", r["top_cause"] or "(none)")
                                    for r in rows)
    out.append("")
    out.append("confusion (expected cause -> top-ranked cause):")
    for (want, got), n in sorted(confusion.items()):
        out.append("  %-24s -> %-24s %d%s" % (want, got, n, "" if want == got else "   <-- miss"))
    n_ok = sum(r["ok"] for r in rows)
    out.append("%d/%d traces as expected" % (n_ok, len(rows)))
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.evaluate",
                                description="Confusion table of the correlator over labelled traces.")
    p.add_argument("directory", nargs="?", default=traces.DEFAULT_DIR)
    p.add_argument("--check", action="store_true", help="exit 1 when any trace is missed")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--write-synthetic", action="store_true",
                   help="(re)generate the synthetic traces into DIRECTORY")
    a = p.parse_args(argv)
    if a.write_synthetic:
        for path in traces.write_synthetic(a.directory):
            print("wrote %s" % path)
        return 0
    try:
        docs = traces.load(a.directory)
    except (OSError, ValueError) as e:
        print("evaluate: %s" % e, file=sys.stderr)
        return 2
    if not docs:
        print("evaluate: no traces in %s" % a.directory, file=sys.stderr)
        return 2
    rows = [row(path, doc) for path, doc in docs]
    print(json.dumps(rows, indent=1) if a.json else table(rows))
    return 1 if a.check and not all(r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
