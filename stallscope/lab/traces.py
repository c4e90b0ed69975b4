"""Labelled traces of the correlator's evaluation set (tests/data/traces, format
``stallscope-trace/1``: tests/data/traces/README.md), written from the scenario table:
``lab-<name>.json`` recorded from a real run (``stallscope lab run NAME --record DIR``),
``syn-<name>.json`` from the scenario's synthetic generator.
"""
import datetime
import glob
import json
import os
import platform
import urllib.parse

from . import scenarios

FORMAT = "stallscope-trace/1"
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "data", "traces")


def load(directory):
    """[(path, document)] of every trace in ``directory``, by file name."""
    docs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            raise ValueError("%s: not a %s file" % (path, FORMAT))
        docs.append((path, doc))
    return docs


def labels(scenario, prefix, source, note):
    verdict, cause = scenario.trace_labels()
    return {"scenario": "%s-%s" % (prefix, scenario.name), "expected_verdict": verdict,
            "expected_cause": cause, "source": source, "note": note}


def _write(path, doc, **dump):
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"), **dump)
        f.write("\n")
    return path


def record(lab, result, directory):
    """Save the agent's timelines of a real run (the rank the scenario's view names, its
    peers beside it) with the scenario's labels; returns the file written. A recording
    replaces the scenario's earlier one in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    bodies = {}
    for rank in range(lab.world):
        q = urllib.parse.urlencode({"rank": rank, "job": lab.job, "seconds": int(lab.duration + 5)})
        bodies[rank] = without_first_batch(lab.agent_of(rank).api("/api/v1/timeline?" + q))
    s = lab.scenario
    shown = 0 if s.view == "peer" else lab.target
    doc = {"format": FORMAT,
           "labels": dict(labels(s, "lab", "recorded", s.title),
                          expected_rank=lab.target if s.stalls else None),
           "recorded": {"at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "kernel": platform.release(), "seconds": int(lab.duration),
                        "command": "stallscope lab run %s --ranks %d --duration %g --record DIR" % (
                            s.name, lab.world, lab.duration),
                        "agent_verdict": result["found"]["verdict"],
                        "agent_top_cause": result["found"]["cause"]},
           "timeline": bodies[shown],
           "peers": [b for r, b in sorted(bodies.items()) if r != shown]}
    return _write(os.path.join(directory, "lab-%s.json" % s.name), doc)


def without_first_batch(body):
    """The timeline without its process's first batch (the workers' start-up), which the
    measured window leaves out too (runner.py: it starts once every rank has had one):
    judged offline, a healthy rank over the line by its start alone is "starting"
    (unknown), and the CI's healthy recording was, twice."""
    first = body.get("first_batch_ns")
    if isinstance(first, int) and not isinstance(first, bool):
        body = dict(body, batches=[b for b in body.get("batches") or () if b["t_end_ns"] > first])
    return body


def write_synthetic(directory):
    """(Re)generate ``syn-<name>.json`` for every scenario with a synthetic generator."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for s in scenarios.SYNTHETIC:
        note, body, peers = s.synthetic("syn-" + s.name)
        doc = {"format": FORMAT,
               "generated_by": "python -m stallscope.lab.evaluate --write-synthetic; do not edit",
               "labels": labels(s, "syn", "synthetic", note), "timeline": body, "peers": peers}
        written.append(_write(os.path.join(directory, "syn-%s.json" % s.name), doc, sort_keys=True))
    return written
