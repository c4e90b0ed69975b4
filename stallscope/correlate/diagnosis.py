"""The node-local diagnosis of one rank: verdict, ranked causes with evidence, and the
numbers ``stallscope diagnose`` needs (the contract in docs/diagnose.md; verdicts and causes
are the vocabulary's, stallscope/vocabulary/causes.py).

Verdicts:
- ``unknown``: fewer than MIN_BATCHES batches in the window, or over the line only by
  the run's first batch, its workers' first start (rules.py: starting).
- ``input_bound``: the loop waited on its own loader for at least DATA_WAIT_LINE of
  its step time (the StallscopeDataWaitHigh alert's line) and the GPU, when it is
  measured, was idle during those waits.
- ``not_input_bound``: this rank's loader keeps up, yet its GPU sat idle without the
  loop waiting on data (it waits elsewhere, typically in a collective for a straggler),
  or, with no GPU signal, another rank of its job on this node is input-bound and
  synchronous steps make this one wait for it.
- ``healthy``: otherwise.
The agent sees only its own node's ranks, so the straggler it names is the worst rank
of the job *on this node*; ``stallscope diagnose`` adds the cluster view.
"""
from collections.abc import Mapping
from typing import Any

from ..vocabulary import MIN_BATCHES, VERDICTS  # noqa: F401 (VERDICTS: the contract)
from . import causes as causes_mod
from . import deaths, epochs, measured, predict, rules, slow_worker, transfer, workers
from .overlap import after_start, data_wait_ratio, input_bound, iterator_starts
from .period import stall_period
from .sawtooth import sawtooth
from .trace import WaitIndex

PREDICTED_CAUSES = 2  # the named cause and its runner-up


def _who(ident):
    return {k: ident.get(k) for k in ("job", "rank", "pod", "namespace", "node")}


def _pct(x):
    return "%.1f%%" % (100 * x)


def _wait(ident, ratio, node="", after=None):
    return rules.RankWait(ident.get("rank"), ident.get("pod"), ident.get("node") or node, ratio, after)


def decide(ib, peers, ident=None, node="", after=None):
    """(verdict, reason) by the one rule set (rules.py) from the node's numbers: this
    rank's data-wait share (every wait, the first batches' included, as the alert counts
    it; ``after``: the same without the run's first batch, rules.RankWait.after_start),
    its job's ranks on this node (RankWait), and the GPU when it is measured."""
    me = _wait(ident or {}, ib.data_wait_ratio, node, after)
    gpu = None
    if ib.gpu_idle_ratio is not None:
        gpu = rules.Gpu(ib.gpu_idle_ratio, ib.gpu_idle_without_wait_ratio, ib.gpu_idle_overlap_ratio)
    j = rules.judge(me, list(peers), gpu, scope="node")
    text = j.reason
    if j.verdict == "input_bound" and ib.iterator_start_wait_seconds > 0.5 * ib.data_wait_seconds:
        text += (" Most of it (%.3gs) is the first batch of %d iterator(s): worker start-up at "
                 "each epoch." % (ib.iterator_start_wait_seconds, ib.iterator_starts))
    return j.verdict, text


def straggler(me, peers, node):
    """The rank of this job with the highest data-wait share among those on this node
    (RankWait; rules.straggler_of: a rank still starting is none)."""
    worst = rules.straggler_of([me] + list(peers))
    note = ("The agent sees only the ranks on node %s; `stallscope diagnose` adds the "
            "cluster view from Prometheus." % (node or "?"))
    if worst is None or not rules.over(worst.ratio):
        return {"rank": None, "pod": None, "node": None, "data_wait_ratio": None,
                "note": "No rank of this job on this node waits on its loader: the straggler, "
                        "if any, is on another node. " + note}
    return {"rank": worst.rank, "pod": worst.pod, "node": worst.node or node,
            "data_wait_ratio": round(worst.ratio, 6), "note": note}


def _row(p):
    row = {"rank": p.rank, "pod": p.pod, "data_wait_ratio": round(p.ratio, 6)}
    if p.after_start is not None:
        row["data_wait_ratio_after_start"] = round(p.after_start, 6)
    return row


def analyse(trace: Any, peers: Any = (), node: str = "", window_seconds: Any = None,
            since_ns: Any = None, quota: Any = None) -> dict[str, Any]:
    """Diagnose ``trace``; ``peers`` are the other ranks' traces on this node (any job).

    ``since_ns``: a stall began then (detect.py). The verdict, the loader's numbers and
    the stall period are judged on the stall's own segment; the signals' co-occurrence
    with the waits on the whole trace, whose earlier part gives the quiet time to compare
    against. ``quota``: the rank's CFS quota, {"measured", "cores"} (causes.separate_cpu)."""
    whole = trace
    if since_ns is not None:
        trace = trace.since(since_ns)
    ident = trace.ident or {}
    span = trace.span()
    out = dict(_who(ident), api="v1", node=ident.get("node") or node,
               window_seconds=window_seconds if window_seconds is not None else (
                   round((span[1] - span[0]) / 1e9, 3) if span else 0.0),
               batches=trace.n, loader=trace.loader, verdict="unknown", reason="",
               data_wait_ratio=None, gpu_idle_overlap_ratio=None, stall_period_steps=0,
               causes=[], not_evaluated=[], straggler=None)
    same_job = [p for p in peers if p is not trace and p.n >= MIN_BATCHES
                and p.ident.get("job") == ident.get("job") and p.ident.get("rank") != ident.get("rank")]
    peers = [_wait(p.ident, data_wait_ratio(p), node, after_start(p)) for p in same_job]
    out["job_ranks_on_node"] = sorted([_row(p) for p in peers], key=lambda d: d["rank"])
    if trace.n < MIN_BATCHES:
        out["reason"] = "Only %d batches in the window (need %d)." % (trace.n, MIN_BATCHES)
        return out
    wi = WaitIndex(trace.t_end, trace.wait)
    ib = input_bound(trace, wi)
    per = stall_period(trace)
    saw = sawtooth(trace, per.period_seconds, wi, per.stall_batches)
    # a detected stall is judged on its own segment, whatever start it holds
    after = ib.data_wait_ratio_after_start if since_ns is None else None
    verdict, reason = decide(ib, peers, ident, node, after)
    out.update(verdict=verdict, reason=reason, data_wait_ratio=round(ib.data_wait_ratio, 6),
               data_wait_seconds=round(ib.data_wait_seconds, 6),
               steady_data_wait_ratio=round(ib.steady_data_wait_ratio, 6),
               iterator_start_wait_seconds=round(ib.iterator_start_wait_seconds, 6),
               step_seconds=round(ib.step_seconds, 6),
               compute_seconds_per_batch=round(ib.compute_seconds, 6),
               gpu={"signal": ib.gpu_signal, "source": trace.gpu_source if ib.gpu_signal else None,
                    "samples": ib.gpu_samples, "idle_ratio": ib.gpu_idle_ratio,
                    "idle_without_wait_ratio": ib.gpu_idle_without_wait_ratio},
               gpu_idle_overlap_ratio=ib.gpu_idle_overlap_ratio,
               stall=per.as_json(), stall_period_steps=per.period_steps,
               stall_period_seconds=round(per.period_seconds, 6), sawtooth=saw.as_json(),
               straggler=straggler(_wait(ident, ib.data_wait_ratio, node, after), peers, out["node"]))
    if after is not None:
        out["data_wait_ratio_after_start"] = round(after, 6)
    if since_ns is not None:
        out["since_ns"] = int(since_ns)
    if verdict == "input_bound":
        steady = ~iterator_starts(trace)
        swi = wi if steady.all() else WaitIndex(trace.t_end[steady], trace.wait[steady])
        wsteady = ~iterator_starts(whole)
        scored, missing = causes_mod.score_signal_causes(
            whole, WaitIndex(whole.t_end[wsteady], whole.wait[wsteady]))
        _, share = workers.busy_share(trace, swi)
        scored = [workers.contradict_cpu_shortage(c, share) for c in scored]
        scored = causes_mod.separate_cpu(scored, quota or {})
        # short of CPU, workers answer the loop's requests for each batch late too
        starved = max((c["score"] for c in scored
                       if c["cause"] in ("cpu_throttle", "cpu_contention")), default=0.0)
        moved = transfer.score(trace, steady, starved)
        if moved is None:
            missing.append(transfer.NAME)
        else:
            scored.append(moved)
        held = slow_worker.score(trace, steady)
        if held is None:
            missing.append(slow_worker.NAME)
        else:
            scored.append(held)
        others = max((c["score"] for c in scored), default=0.0)
        tfw = workers.score(trace, per, others, swi)
        if tfw is None:
            missing.append("too_few_workers")
        else:
            scored.append(tfw)
        # the restarts after a worker's death are the death's, not epochs' (deaths.py)
        started = epochs.score(ib, deaths.restarts(trace), trace)
        if started is not None:
            scored = epochs.steady_part(scored, started)
            scored.append(started)
        # judged on the whole wait, the restarts' included: not discounted as steady; over
        # the whole window, as the signals are (a stall segment the detector dated from
        # steady batches may begin after the deaths that caused most of the wait)
        scored = deaths.merge(scored, deaths.score(whole))
        named = {c["cause"] for c in scored}
        missing = [c for c in dict.fromkeys(missing + list(deaths.CAUSES)) if c not in named]
        out["causes"] = causes_mod.rank_causes(scored)
        out["not_evaluated"] = sorted(missing, key=causes_mod.VOCABULARY.index)
        add_predictions(out, measured.measure(trace, ib, quota))
    return out


def add_predictions(out: dict[str, Any], m: Any) -> None:
    """The headroom and, for the two best causes, what their fix will buy
    (predict.py); ``prediction`` is the top cause's."""
    if m is None:
        return
    out["headroom"] = predict.headroom(m)
    for c in out["causes"][:PREDICTED_CAUSES]:
        c["prediction"] = predict.for_cause(c["cause"], m)
    if out["causes"]:
        out["prediction"] = out["causes"][0]["prediction"]


def top_cause(diagnosis: dict[str, Any]) -> Any:
    causes = diagnosis.get("causes") or []
    return causes[0]["cause"] if causes else None


def _severity(d: dict[str, Any]) -> Any:
    order = {"input_bound": 3, "not_input_bound": 2, "healthy": 1, "unknown": 0}
    return order[d["verdict"]], d.get("data_wait_ratio") or 0.0


def most_severe(found: list[tuple[Mapping[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The API's answer for several matching ranks, [(identity, diagnosis)]: the one
    that waits most on its loader, with the others summed up in ``matched_ranks``."""
    body = dict(max(found, key=lambda f: _severity(f[1]))[1])
    if len(found) > 1:
        body["matched_ranks"] = sorted(
            [{"job": i["job"], "rank": i["rank"], "pod": i["pod"], "verdict": d["verdict"],
              "data_wait_ratio": d["data_wait_ratio"], "top_cause": top_cause(d)} for i, d in found],
            key=lambda m: (m["job"], m["rank"]))
        body["note"] = ("%d ranks match; this is the one that waits most on its loader, "
                        "see matched_ranks for the others." % len(found))
    return body
