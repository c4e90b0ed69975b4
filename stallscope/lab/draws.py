"""Drawn scenarios (lab/sampler.py) run live, recorded into the evaluation set, replayed
through the analysis, and scored per fault class (issue 49, item 6).

    stallscope lab sample --seed N [--class C|all] [--count K] [--record DIR] [--apply-fix]
    python -m stallscope.lab.draws [DIR ...] [--live] [--detail] [--json] [--check-inputs]

A live draw runs as ``stallscope lab run`` runs a scenario (lab/runner.py: the agent,
Prometheus where installed, the job with its fault on the last rank, the measured
window; findings.py: ``stallscope diagnose`` as on-call runs it), then asks for three
answers about the faulty rank: ``stallscope diagnose`` (the agent's with Prometheus,
following the straggler from rank 0 as on-call does), the agent's own
``/api/v1/diagnosis``, and Prometheus alone; and the agent's answer for every other
rank (the victims). Recorded (``--record DIR``), a draw is one gzipped JSON file,
``draw-SEED-CLASS.json.gz``, format ``stallscope-draw/1``:

- ``draw``: the sampler's draw (seed, class, every parameter: sampler.Draw.to_json);
- ``expected``: the injected truth (cause, verdict, the faulty rank, the victims);
- ``timelines``: every rank's ``/api/v1/timeline`` body over the window (the inputs the
  analysis is replayed on, as tests/data/traces holds them, without the first batch);
  the node-wide samples, the same in every rank's, once beside them (``node_signals``);
- ``live``: the three answers and each rank's verdict at the time, the measured data-wait
  and batches per rank;
- ``fix`` (``--apply-fix``): the prediction against the rerun with it applied
  (applyfix.compare), or why there was none;
- ``recorded``: when, the kernel, the command, the wall time.

Replayed, each rank's timeline is diagnosed with the others as its peers
(correlate.diagnosis.analyse, as python -m stallscope.lab.evaluate does): seconds for
the whole set. A draw is scored on its top cause (the faulty rank input_bound with the
injected cause first; for a healthy draw, the faulty rank healthy), its victims (every
other rank healthy or not_input_bound, naming no other straggler), no input_bound rank
on a healthy draw, and its prediction: one that promises more workers will end a stall
whose injected capacity they share (a CPU quota, crowded cores, a shaped link, a dead
mount, a full /dev/shm, the handoff) crosses the capacity; where the draw applied the
fix, the step the prediction gave against the step measured. A draw whose measured wait
contradicts its label (label_held) is listed, not scored.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import glob
import gzip
import io
import json
import os
import platform
import sys
import time
import urllib.parse

from .. import diagnose as dg
from ..correlate import codec, diagnosis, story
from ..correlate.model import Diagnosis, Prediction
from ..correlate.trace import RankTrace
from ..processes import teardown
from ..vocabulary import DATA_WAIT_LINE
from . import applyfix, findings, runner, sampler, traces
from .job import Unavailable
from .session import Session

FORMAT = "stallscope-draw/1"
DEFAULT_DIR = os.path.join(os.path.dirname(traces.DEFAULT_DIR), "draws")
# Classes whose injected capacity more loader workers share: a prediction that more
# workers end the stall crosses it.
CAPPED = {"cpu_throttle": "the CPU quota", "cpu_contention": "the node's cores",
          "bandwidth_bound": "the shaped link", "fuse_unhealthy": "the dead mount",
          "shm_exhaustion": "the /dev/shm size", "transfer_cost": "the training thread's handoff"}
CALM = ("healthy", "not_input_bound")
# The setting of a prediction that lifts each capped class's capacity: with it, more
# workers may help.
LIFTS = {"cpu_throttle": "cpu_limit_cores", "bandwidth_bound": "link_capacity_bytes_per_second",
         "shm_exhaustion": "shm_mib"}


# -- live -------------------------------------------------------------------------------
# how far short of the drawn duration the agent's scheduled analysis looks back (_live)
SCHEDULED_MARGIN_S = 5.0

def _live(scenario, opts, want_bodies=True):
    """Run ``scenario`` (a draw's) as runner.run does; returns (result, {rank: timeline},
    {rank: agent diagnosis}, Prometheus alone's answer for the result's rank or None)."""
    reason = scenario.make_fault().missing()
    if reason:
        raise Unavailable("%s %s" % (scenario.name, reason))
    with teardown.Teardown() as td:
        session = Session(td, workdir=opts.workdir, say=opts.say)
        session.say("lab: %s (%d ranks, %.0fs): %s" % (scenario.name, scenario.real.ranks,
                                                       scenario.real.duration, scenario.title))
        # the correlator's scheduled analysis (whose scores Prometheus holds) within the drawn
        # duration, as diagnose asks: the lab's default covers the whole run and its workers'
        # start (a drawn 3 % stall's published top cause was epoch_start, its start's wait).
        # SCHEDULED_MARGIN_S short of it: the analysis published last ran up to its interval
        # and a scrape before the end, and its window must not reach back to the first batch
        session.start_agent(scenario.real.duration, list(scenario.make_fault().agent_args()) + [
            "--correlate.window", str(max(10, int(scenario.real.duration - SCHEDULED_MARGIN_S)))])
        if opts.prometheus is not False and findings.prometheus_installed():
            session.start_prometheus()
        job = session.start_job(scenario, ranks=scenario.real.ranks, duration=scenario.real.duration)
        base = job.wait_ready(opts.warmup_batches)
        judged = max(10.0, scenario.real.duration - SCHEDULED_MARGIN_S)
        now, fired, history = runner._window(job, base, opts.live, until_verdict=judged)
        job.judged_s += runner.verdict_seconds(history, job.target, judged) - judged
        result = findings.collect(job, base, now, fired, history)
        per_rank = findings.agent_diagnoses(job)
        alone = None
        if job.prom is not None:
            try:
                alone = dg.encode(dg.run(job.pod(job.target), namespace=findings.NAMESPACE, agent_url=False,
                                         window="%ds" % int(job.judged_s), prometheus_url=job.prom.url))
            except dg.DiagnoseError as e:
                alone = {"error": str(e)}
        bodies = {}
        if want_bodies:
            for rank in range(job.world):
                q = urllib.parse.urlencode({"rank": rank, "job": job.job, "seconds": int(job.judged_s + 5)})
                bodies[rank] = traces.without_first_batch(job.agent_of(rank).api("/api/v1/timeline?" + q))
    return result, bodies, per_rank, alone


@dataclasses.dataclass(frozen=True)
class Answer:
    """One path's answer about a rank, as a draw records it (``live``) and the replay
    gives it: the verdict, the top cause, the top three causes with their scores, the
    straggler it names, the prediction; or the error the path gave. diagnose's answer
    also says which rank it followed to, and how (``source``), and, where diagnose gave
    no report, only the verdict and cause it found (``causes`` None: not recorded)."""
    verdict: str | None = None
    cause: str | None = None
    causes: tuple[tuple[str, float], ...] | None = None
    straggler: object = None
    prediction: Prediction | None = None
    error: str | None = None
    rank: object = None
    source: str | None = None   # diagnose's answer only

    @classmethod
    def of(cls, d: Diagnosis) -> Answer:
        """The answer of a Diagnosis (the replay's, the agent's decoded)."""
        return cls(d.verdict, d.causes[0].cause if d.causes else None,
                   tuple((c.cause, c.score) for c in d.causes[:3]),
                   d.straggler.rank if d.straggler is not None else None, d.prediction)

    @classmethod
    def of_body(cls, body):
        """The answer of a diagnosis body as it came (the agent's /api/v1/diagnosis or a
        ``diagnose --json`` document: their verdict, causes, straggler and prediction are
        the codec's), or None when it is not one."""
        if not isinstance(body, dict):
            return None
        if body.get("error") and "verdict" not in body:
            return cls(error=body["error"])
        verdict, causes, straggler, prediction = codec.decode_headline(body)
        return cls(verdict, causes[0].cause if causes else None,
                   tuple((c.cause, c.score) for c in causes[:3]), straggler, prediction)

    @property
    def failed(self):
        return self.error is not None

    def to_json(self):
        """As a draw file holds it (format FORMAT)."""
        if self.error is not None:
            out = {"error": self.error}
        elif self.causes is not None:
            out = {"verdict": self.verdict, "cause": self.cause, "causes": [list(c) for c in self.causes],
                   "straggler": self.straggler,
                   "prediction": codec.prediction(self.prediction) if self.prediction is not None else None}
        elif self.verdict is not None:
            out = {"verdict": self.verdict, "cause": self.cause}
        else:
            out = {}
        if self.source is not None:
            out.update(rank=self.rank, source=self.source)
        return out

    @classmethod
    def from_json(cls, body):
        """An answer a draw file holds (None stays None)."""
        if body is None:
            return None
        values = {f.name: body.get(f.name) for f in dataclasses.fields(cls)}
        if values["causes"] is not None:
            values["causes"] = tuple((c, s) for c, s in values["causes"])
        values["prediction"] = codec.decode_prediction(values["prediction"]) if values["prediction"] else None
        return cls(**values)


def _recorded(answer):
    return answer.to_json() if answer is not None else None


def expected(d):
    return {"cause": d.cause, "verdict": "input_bound" if d.cause else "healthy", "rank": d.target_rank,
            "victims": [r for r in range(d.ranks) if r != d.target_rank]}


def run_draw(d, opts, apply_fix=False):
    """Run draw ``d`` live; returns its document (format FORMAT), recorded into
    ``opts.record`` when set. Raises Unavailable when the machine lacks what it needs."""
    t0 = time.monotonic()
    scenario = d.scenario()
    result, bodies, per_rank, alone = _live(scenario, opts)
    found = result["found"]  # findings.diagnose's: cause, rank, verdict, source always
    details = result.get("diagnosis")
    report = details.get("report") if isinstance(details, dict) else None
    followed = dict(rank=found["rank"], source=found["source"])
    diagnosed = dataclasses.replace(Answer.of_body(report) or Answer(), **followed) if report else \
        Answer(found["verdict"], found["cause"], **followed)
    live = {"diagnose": diagnosed.to_json(),
            "agent": {str(r): _recorded(Answer.of_body(b)) for r, b in sorted(per_rank.items())},
            "prometheus": _recorded(Answer.of_body(alone)),
            "data_wait": {str(r["rank"]): r.get("data_wait_ratio") for r in result["ranks"]},
            "batches": {str(r["rank"]): r.get("batches") for r in result["ranks"]}}
    doc = {"format": FORMAT, "draw": d.to_json(), "expected": expected(d),
           "timelines": [bodies[r] for r in sorted(bodies)], "live": live}
    _share_node_signals(doc)
    if apply_fix:
        doc["fix"] = _apply_fix(d, scenario, result, opts)
    doc["recorded"] = {"at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "kernel": platform.release(), "cpus": os.cpu_count(),
                       "command": "stallscope lab sample --seed %d --class %s%s" % (
                           d.seed, d.klass, " --apply-fix" if apply_fix else ""),
                       "wall_s": round(time.monotonic() - t0, 1)}
    if opts.record:
        doc["recorded"]["file"] = write(doc, opts.record)
    return _restore_node_signals(doc)


def _apply_fix(d, scenario, result, opts):
    """Rerun the draw with diagnose's prediction applied (applyfix.py), or say why not."""
    p = applyfix.prediction_of(result)
    if not p or not p.get("settings"):
        return {"error": "no prediction with a configuration change"}
    try:
        after_scenario = applyfix.fixed(scenario, p["settings"])
        rerun = runner.Options(**dict(vars(opts), record=None,
                                      warmup_batches=applyfix.queue_fill(after_scenario)))
        after, _, _, _ = _live(after_scenario, rerun, want_bodies=False)
    except Unavailable as e:
        return {"error": str(e), "change": p.get("change")}
    return applyfix.compare(p, after, result)


def path_of(d_json, directory):
    return os.path.join(directory, "draw-%d-%s.json.gz" % (d_json["seed"], d_json["klass"].replace("_", "-")))


def write(doc, directory):
    """``doc`` to DIRECTORY/draw-SEED-CLASS.json.gz (compact JSON, gzip without a date:
    the same document gives the same bytes); returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = path_of(doc["draw"], directory)
    raw = (json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n").encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(raw)
    with open(path + ".tmp", "wb") as f:
        f.write(buf.getvalue())
    os.replace(path + ".tmp", path)
    return path


def _share_node_signals(doc):
    """Every rank's timeline on the one node carries the same node-wide samples: stored
    once, as ``node_signals`` beside the timelines (load() puts them back)."""
    shared = [b.get("node_signals") for b in doc["timelines"]]
    if len(shared) > 1 and all(s == shared[0] for s in shared):
        doc["node_signals"] = shared[0]
        doc["timelines"] = [{k: v for k, v in b.items() if k != "node_signals"} for b in doc["timelines"]]


def _restore_node_signals(doc):
    if "node_signals" in doc:
        doc["timelines"] = [dict(b, node_signals=doc["node_signals"]) for b in doc["timelines"]]
        del doc["node_signals"]
    return doc


def load(directories):
    """[(path, document)] of every recorded draw in ``directories``, by file name."""
    return [(path, read(path)) for directory in directories
            for path in sorted(glob.glob(os.path.join(directory, "draw-*.json.gz")))]


def read(path):
    """One recorded draw's document."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError("%s: not a %s file" % (path, FORMAT))
    return _restore_node_signals(doc)


# -- replay -----------------------------------------------------------------------------
def diagnoses(doc):
    """Each rank's diagnosis from the recorded timelines, the one the agent would make:
    {rank (str): Diagnosis}."""
    bodies = doc["timelines"]
    ranks = [RankTrace.from_timeline(b) for b in bodies]
    out = {}
    for body, trace in zip(bodies, ranks):
        node = (body.get("rank") or {}).get("node", "")
        d = diagnosis.analyse(trace, ranks, node=node, window_seconds=body.get("seconds"))
        out[str((body.get("rank") or {}).get("rank"))] = d
    return out


def replay(doc):
    """Each rank's answer from the recorded timelines: {rank (str): Answer}."""
    return {rank: Answer.of(d) for rank, d in diagnoses(doc).items()}


def check_inputs(doc):
    """Problems with a recorded draw's stored inputs (empty: none): its draw is what the
    sampler draws from its seed and class (same sampler version), and it holds one
    timeline per rank of the draw, each with batches or a wait in progress."""
    problems = []
    d = doc["draw"]
    if d.get("sampler") == sampler.SAMPLER:
        again = sampler.draw(d["seed"], d["klass"]).to_json()
        if json.loads(json.dumps(again)) != d:
            problems.append("the draw differs from sampler.draw(%d, %r)" % (d["seed"], d["klass"]))
    ranks = sorted((b.get("rank") or {}).get("rank") for b in doc["timelines"])
    if ranks != list(range(d["ranks"])):
        problems.append("timelines of ranks %s, the draw has %d" % (ranks, d["ranks"]))
    # a rank hung from the start (a /dev/shm with room for one batch) has no batch in the
    # window, only the wait in progress
    if any(not b.get("batches") and not b.get("open_wait") for b in doc["timelines"]):
        problems.append("a timeline with neither batches nor a wait in progress")
    if doc["expected"] != expected(sampler.Draw.from_json(d)):
        problems.append("the expected answer differs from the draw's")
    return problems


# -- scoring ----------------------------------------------------------------------------
def score(doc, ranks, target=None):
    """One draw's score from ``ranks`` ({rank: Answer}, every rank's) and ``target`` (the
    faulty rank's Answer when another path gave it; default its entry in ``ranks``)."""
    exp = doc["expected"]
    klass = doc["draw"]["klass"]
    t = target if target is not None else ranks.get(str(exp["rank"]))
    if t is None or t.failed:
        return {"top1": False, "victims": None, "no_input_bound": None, "prediction": None,
                "got": "error", "held": label_held(doc)}
    if exp["cause"] is None:
        top1 = t.verdict == "healthy"
    else:
        top1 = t.verdict == "input_bound" and t.cause == exp["cause"]
    victims = None
    if exp["victims"] and exp["cause"] is not None:
        victims = all(_victim_ok(ranks.get(str(r)), exp["rank"]) for r in exp["victims"])
    no_ib = None
    if exp["cause"] is None:
        no_ib = all(a is None or a.verdict != "input_bound" for a in ranks.values())
    return {"top1": top1, "victims": victims, "no_input_bound": no_ib,
            "prediction": _prediction_ok(klass, doc["draw"], t.prediction),
            "got": "%s/%s" % (t.verdict, t.cause or "-"), "held": label_held(doc)}


def label_held(doc):
    """Whether the run measured what its label says (the agent's data-wait over the
    window): a stall draw's faulty rank waits at least the line, a healthy draw's ranks
    all under it. None where not judged: a hang (a wait still in progress is not in the
    counters) or no measurement. A draw whose label the machine contradicted (a healthy
    job whose handoff alone crossed the line on a busy machine, a fault just over the
    line that the machine's noise hid) is scored apart: its label is not the truth."""
    waits = {r: w for r, w in ((doc.get("live") or {}).get("data_wait") or {}).items() if w is not None}
    exp = doc["expected"]
    if doc["draw"]["shape"] == "hang" or not waits:
        return None
    if exp["cause"] is None:
        return max(waits.values()) < DATA_WAIT_LINE
    w = waits.get(str(exp["rank"]))
    return None if w is None else w >= DATA_WAIT_LINE


def _victim_ok(a, target):
    if a is None or a.verdict not in CALM or a.cause:
        return False
    return a.straggler in (None, target)


def _prediction_ok(klass, d, p):
    """True: consistent with what was injected; False: more workers promised to end the
    stall past the injected capacity, which the prediction leaves as it is; None: no
    prediction with a change."""
    if p is None or not p.settings:
        return None
    workers = p.settings.num_workers
    had = {**d["everyone"], **d["target"]}.get("workers", 2)
    lifted = LIFTS.get(klass) in p.settings.names()
    if klass in CAPPED and not lifted and workers is not None and workers > had and \
            (p.predicted_data_wait_ratio or 0) < DATA_WAIT_LINE:
        return False
    return True


def fresh_scores(doc):
    """The live answers' scores: diagnose, the agent's API, Prometheus alone, and the
    replay of the recorded inputs."""
    live = doc["live"]
    agent = {rank: Answer.from_json(a) for rank, a in live["agent"].items()}
    out = {"diagnose": score(doc, agent, Answer.from_json(live["diagnose"])),
           "agent": score(doc, agent),
           "replay": score(doc, replay(doc))}
    if live.get("prometheus"):
        out["prometheus"] = score(doc, agent, Answer.from_json(live["prometheus"]))
    return out


def _frac(values):
    vals = [v for v in values if v is not None]
    return "%d/%d" % (sum(bool(v) for v in vals), len(vals)) if vals else "-"


# the bar for a prediction against the rerun with its fix applied (issue 49)
FIX_WITHIN = 0.15


def _cells(rs, paths):
    """A table row's cells (after the class) for the rows ``rs`` of one class, or all."""
    main = paths[0]
    done = [r for r in rs if "scores" in r]
    ran = [r for r in done if r["scores"][main]["held"] is not False]
    errs = [abs(r["fix"]["step_error"]) for r in ran
            if isinstance(r.get("fix"), dict) and r["fix"].get("step_error") is not None]
    return ([str(len(done)), _frac(r["scores"][main]["held"] for r in done)]
            + [_frac(r["scores"][p]["top1"] for r in ran if p in r["scores"]) for p in paths]
            + [_frac(r["scores"][main][k] for r in ran) for k in ("victims", "no_input_bound", "prediction")]
            + ["%.0f%% (%d, %d over %.0f%%)" % (100 * sum(errs) / len(errs), len(errs),
                                               sum(e > FIX_WITHIN for e in errs), 100 * FIX_WITHIN)
               if errs else "-",
               str(len(rs) - len(done)) if len(rs) > len(done) else "-"])


def table(rows, paths=("replay",)):
    """The per-class table: rows are {"class", "seed", "scores": {path: score}, "fix"?}
    or {"class", "seed", "skipped": why}; the first of ``paths`` scores all but top1."""
    by = collections.defaultdict(list)
    for r in rows:
        by[r["class"]].append(r)
    head = ["class", "draws", "label held"] + ["top1 %s" % p for p in paths] + [
        "victims", "healthy: no input_bound", "prediction in capacity", "fix step error", "skipped"]
    lines = [[klass] + _cells(by[klass], paths) for klass in sampler.CLASSES if by.get(klass)]
    if not lines:
        return "no draws"
    lines.append(["all"] + _cells(rows, paths))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    out = [fmt % tuple(head), fmt % tuple("-" * w for w in widths)] + [fmt % tuple(x) for x in lines]
    out.append("(top1, victims, no input_bound and prediction over the draws whose label held or "
               "was not judged)")
    return "\n".join(s.rstrip() for s in out)


def detail(rows, paths=("replay",)):
    """One line per draw: seed, class, what each path found."""
    out = []
    for r in rows:
        if "scores" not in r:
            out.append("  %-8s %-22s skipped: %s" % (r["seed"], r["class"], r.get("skipped")))
            continue
        got = "  ".join("%s %s%s" % (p, r["scores"][p]["got"], "" if r["scores"][p]["top1"] else " MISS")
                        for p in paths if p in r["scores"])
        held = r["scores"][paths[0]]["held"]
        contradicted = "  (label contradicted by the measured wait)" if held is False else ""
        out.append("  %-8s %-22s %s%s" % (r["seed"], r["class"], got, contradicted))
    return "\n".join(out)


LIVE_PATHS = ("diagnose", "agent", "prometheus", "replay")


def replay_rows(docs, live=False):
    """A table row per recorded draw: the replay's score, and with ``live`` first the
    answers recorded at the time (diagnose, the agent's API, Prometheus alone). Without
    ``live`` a row keeps the replay's answers too ("answers": {rank: Answer}) and what
    each rank's report says twice that disagrees, where it does ("contradictions":
    {rank: [sentence]}, correlate/story.py)."""
    rows = []
    for path, doc in docs:
        d = doc["draw"]
        row = {"class": d["klass"], "seed": d["seed"], "file": os.path.basename(path), "fix": doc.get("fix")}
        if live:
            row["scores"] = fresh_scores(doc)
        else:
            made = diagnoses(doc)
            row["answers"] = {rank: Answer.of(d) for rank, d in made.items()}
            row["scores"] = {"replay": score(doc, row["answers"])}
            # one report, one story (issue 49): a statement each rank's report makes twice
            row["contradictions"] = {rank: c for rank, d in made.items() if (c := story.contradictions(d))}
        rows.append(row)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m stallscope.lab.draws",
                                description="Replay recorded draws through the analysis; a table per class.")
    p.add_argument("directories", nargs="*", default=[DEFAULT_DIR])
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--detail", action="store_true", help="one line per draw too")
    p.add_argument("--live", action="store_true",
                   help="also score the answers recorded at the time (diagnose, the agent, Prometheus)")
    p.add_argument("--check-inputs", action="store_true",
                   help="exit 1 when a draw's stored inputs are not what its seed draws")
    a = p.parse_args(argv)
    try:
        docs = load(a.directories)
    except (OSError, ValueError) as e:
        print("draws: %s" % e, file=sys.stderr)
        return 2
    if not docs:
        print("draws: no recorded draws in %s" % ", ".join(a.directories), file=sys.stderr)
        return 2
    bad = [(path, prob) for path, doc in docs for prob in check_inputs(doc)]
    t0 = time.monotonic()
    rows = replay_rows(docs, a.live)
    paths = LIVE_PATHS if a.live else ("replay",)
    if a.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "answers"} for r in rows], indent=1))
    else:
        print("recorded draws replayed (%d, %.2fs): %s" % (len(rows), time.monotonic() - t0,
                                                             ", ".join(a.directories)))
        if a.live:
            print("top1 by each path: the answers recorded live, and the replay now")
        print(table(rows, paths))
        if a.detail:
            print(detail(rows, paths))
    for path, prob in bad:
        print("draws: %s: %s" % (path, prob), file=sys.stderr)
    return 1 if a.check_inputs and bad else 0


if __name__ == "__main__":
    sys.exit(main())
