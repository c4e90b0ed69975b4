"""The v1 JSON of a diagnosis, both ways (issue 29): ``encode`` is the one encoder (the
agent's ``/api/v1/diagnosis`` and, inside its report, ``stallscope diagnose --json``);
``decode`` reads an agent's answer back into the typed objects of model.py, so
``stallscope diagnose`` works on attributes, never on string keys.

The wire format is the contract of docs/diagnose.md (field names stay; fields are added
freely): rounded floats, ``null`` for what was not measured, causes ranked by score.
What the decoder does not know (a newer agent's fields) it leaves out; a body that is
not a diagnosis raises ``Malformed`` with the field that is wrong.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..report import LoaderSettings
from .detect import Detection
from .model import (
    Budget,
    Cause,
    Change,
    Component,
    Diagnosis,
    Evidence,
    GpuView,
    Headroom,
    Identity,
    LoaderError,
    Loop,
    Mark,
    Matched,
    Prediction,
    ProposedSettings,
    RankRow,
    SetupWarning,
    Stats,
    Straggler,
    WatchedSettings,
    WorkerSpread,
)
from .period import StallPeriod
from .sawtooth import Sawtooth

API = "v1"
JSON = dict[str, Any]


class Malformed(ValueError):
    """A body that is not a v1 diagnosis."""


def _r(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else round(float(v), digits)


def _fields(obj: Any) -> JSON:
    """A flat dataclass's fields, floats rounded as the API shows them."""
    return {k: (round(v, 6) if isinstance(v, float) else v)
            for k, v in dataclasses.asdict(obj).items()}


# -- encode ---------------------------------------------------------------------------
def _rf(v: Any) -> Any:
    """A measured float rounded as the API shows it; anything else as it is."""
    return round(v, 6) if isinstance(v, float) else v


def evidence(e: Evidence) -> JSON:
    during = _rf(e.during_stalls)
    out: JSON = {"signal": e.signal, "value": during, "during_stalls": during,
                 "outside_stalls": _rf(e.outside_stalls), "threshold": e.threshold,
                 "direction": e.direction}
    for k in ("scope", "explained_wait_share", "quiet_time_active_share", "samples", "judged_by",
              "worker_pid", "starts"):
        v = getattr(e, k)
        if v is not None:
            out[k] = _rf(v)
    if e.judged_by in ("co-occurrence", "intensity", "level") and e.quiet_time_active_share is None:
        out["quiet_time_active_share"] = None  # level-only: no quiet time to judge by
    return out


def prediction(p: Prediction) -> JSON:
    out: JSON = {"cause": p.cause, "change": p.change, "settings": dict(p.settings.items()),
                 "predicted_data_wait_ratio": p.predicted_data_wait_ratio,
                 "predicted_step_seconds": p.predicted_step_seconds, "speedup": p.speedup,
                 "basis": p.basis, "confidence": p.confidence}
    if p.rules_out:
        out["rules_out"] = list(p.rules_out)
        if "num_workers" in p.rules_out and p.settings:
            out["workers_alone_useless"] = True
    for k in ("cpu_limit_cores", "crowded_ratio", "first_batch_seconds", "removed_share", "cpu_note",
              "memory_note", "bound_by"):
        v = getattr(p, k)
        if v is not None:
            out[k] = v
    return out


def worker(w: WorkerSpread) -> JSON:
    out = _fields(w)
    out["workers"] = {str(pid): {"load_seconds": load, "batches": n, "wait_seconds": waited}
                      for pid, (load, n, waited) in sorted(w.workers.items())}
    return out


def cause(c: Cause) -> JSON:
    out: JSON = {"cause": c.cause, "score": c.score, "summary": c.summary, "kind": c.kind,
                 "evidence": [evidence(e) for e in c.evidence]}
    if c.prediction is not None:
        out["prediction"] = prediction(c.prediction)
    if c.worker is not None:
        out["worker"] = worker(c.worker)
    return out


def encode(d: Diagnosis, now_ns: int | None = None) -> JSON:
    """The /api/v1/diagnosis body; ``now_ns`` dates the detection's ``since_seconds_ago``."""
    out: JSON = {"job": d.who.job, "rank": d.who.rank, "pod": d.who.pod, "namespace": d.who.namespace,
                 "node": d.who.node, "api": API, "window_seconds": d.window_seconds,
                 "batches": d.batches, "loader": d.loader.to_json() if d.loader is not None else None,
                 "verdict": d.verdict, "reason": d.reason, "rule": d.rule,
                 "data_wait_ratio": d.data_wait_ratio,
                 "gpu_idle_overlap_ratio": d.gpu_idle_overlap_ratio,
                 "stall_period_steps": d.stall_period_steps,
                 "causes": [cause(c) for c in d.causes], "not_evaluated": list(d.not_evaluated),
                 "straggler": _fields(d.straggler) if d.straggler is not None else None,
                 "job_ranks_on_node": [_rank_row(r) for r in d.job_ranks_on_node]}
    if d.loop is not None:
        out.update(data_wait_seconds=d.loop.data_wait_seconds,
                   steady_data_wait_ratio=d.loop.steady_data_wait_ratio,
                   iterator_start_wait_seconds=d.loop.iterator_start_wait_seconds,
                   step_seconds=d.loop.step_seconds,
                   compute_seconds_per_batch=d.loop.compute_seconds_per_batch)
        if d.loop.data_wait_ratio_after_start is not None:
            out["data_wait_ratio_after_start"] = d.loop.data_wait_ratio_after_start
        if d.loop.handoff_ratio is not None:
            out["handoff_ratio"] = d.loop.handoff_ratio
    if d.gpu is not None:
        out["gpu"] = _fields(d.gpu)
    if d.stall is not None:
        out["stall"] = d.stall.as_json()
        out["stall_period_seconds"] = round(d.stall.period_seconds, 6)
    if d.sawtooth is not None:
        out["sawtooth"] = d.sawtooth.as_json()
    if d.since_ns is not None:
        out["since_ns"] = d.since_ns
    if d.headroom is not None:
        out["headroom"] = _fields(d.headroom)
    if d.prediction is not None:
        out["prediction"] = prediction(d.prediction)
    if d.detection is not None:
        at = now_ns if now_ns is not None else (d.detected_at_ns or 0)
        out["detection"] = d.detection.as_json(at)
    if d.hang is not None:
        out["hang"] = dict(d.hang)
    if d.change is not None:
        out["change"] = change(d.change)
    if d.matched_ranks:
        out["matched_ranks"] = [_fields(m) for m in d.matched_ranks]
    if d.note:
        out["note"] = d.note
    # set-up checks (issue 32): always present, [] when every judged check passed
    out["warnings"] = [_fields(w) for w in d.warnings]
    out["checks_unknown"] = list(d.checks_unknown)
    if d.loader_error is not None:
        out["loader_error"] = _fields(d.loader_error)
    if d.budget is not None:
        out["budget"] = budget(d.budget)
    return out


def budget(b: Budget) -> JSON:
    """The stall's time budget (correlate/budget.py): each component's seconds, share of
    the wait and cause, largest first, and its words for a report."""
    return {"wait_seconds": _r(b.wait_seconds), "ready_seconds": _r(b.ready_seconds),
            "handoff_seconds": _r(b.handoff_seconds), "workers_idle_ratio": _r(b.workers_idle, 4),
            "sampled": b.sampled, "critical": b.critical.name if b.critical else None,
            "components": [{"name": c.name, "seconds": _r(c.seconds), "share": _r(c.share, 4),
                            "cause": c.cause, "context": c.context, "words": c.words}
                           for c in b.components]}


def decode_budget(body: Any) -> Budget:
    b = _map(body, "budget")
    comps = []
    for x in _list(b, "components"):
        c = _map(x, "a budget component")
        name = _str(c, "name")
        if not name:
            raise Malformed("a budget component has no name")
        comps.append(Component(name, _num(c, "seconds") or 0.0, _num(c, "share") or 0.0,
                               _str(c, "cause"), _str(c, "context") or ""))
    return Budget(_num(b, "wait_seconds") or 0.0, _num(b, "ready_seconds") or 0.0,
                  _num(b, "handoff_seconds") or 0.0, tuple(comps), _num(b, "workers_idle_ratio"),
                  bool(b.get("sampled")))


def change(c: Change) -> JSON:
    """A marked change: the mark's fields, ``before``/``after`` and the prediction's error."""
    m = c.mark
    out: JSON = {"at_ns": m.at_ns, "at_wall": m.at_wall, "what": m.what,
                 "from": dict(m.before_settings.items()), "to": dict(m.after_settings.items()),
                 "predicted": prediction(m.predicted) if m.predicted is not None else None,
                 "before": _fields(c.before) if c.before is not None else None,
                 "after": _fields(c.after) if c.after is not None else None, "stall_gone": c.stall_gone}
    if c.step_error is not None:
        out["step_error"] = c.step_error
    return out


def decode_change(body: Any) -> Change:
    b = _map(body, "change")

    def stats(key: str) -> Stats | None:
        v = b.get(key)
        return None if v is None else _dataclass(Stats, v, key)
    mark = Mark(_int(b, "at_ns") or 0, _str(b, "at_wall") or "?", _str(b, "what") or "",
                _dataclass(WatchedSettings, b.get("from") or {}, "from"),
                _dataclass(WatchedSettings, b.get("to") or {}, "to"),
                decode_prediction(b["predicted"]) if b.get("predicted") else None)
    return Change(mark, stats("before"), stats("after"), bool(b.get("stall_gone")), _num(b, "step_error"))


def _rank_row(r: RankRow) -> JSON:
    out: JSON = {"rank": r.rank, "pod": r.pod, "data_wait_ratio": r.data_wait_ratio}
    if r.data_wait_ratio_after_start is not None:
        out["data_wait_ratio_after_start"] = r.data_wait_ratio_after_start
    return out


# -- decode ---------------------------------------------------------------------------
def _map(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise Malformed("%s is not an object" % what)
    return body


def _num(body: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    v = body.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Malformed("%s is not a number" % key)
    return float(v)


def _int(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise Malformed("%s is not an integer" % key)
    return int(v)


def _str(body: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    v = body.get(key, default)
    if v is not None and not isinstance(v, str):
        raise Malformed("%s is not a string" % key)
    return v


def _list(body: Mapping[str, Any], key: str) -> list[Any]:
    v = body.get(key) or []
    if not isinstance(v, list):
        raise Malformed("%s is not a list" % key)
    return v


def decode_evidence(body: Any) -> Evidence:
    b = _map(body, "an evidence row")
    during = b.get("during_stalls")
    if during is None:
        during = b.get("value")
    if during is not None and not isinstance(during, (int, float)):
        during = None  # a row whose value is not a number (a label) shows as n/a
    return Evidence(str(b.get("signal") or "?"), during, _num(b, "threshold"),
                    _str(b, "direction") or "above", _num(b, "outside_stalls"), _str(b, "scope"),
                    _num(b, "explained_wait_share"), _num(b, "quiet_time_active_share"),
                    _int(b, "samples"), _str(b, "judged_by"), _int(b, "worker_pid"), _int(b, "starts"))


SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(ProposedSettings))


def decode_settings(body: Any) -> ProposedSettings:
    """A prediction's ``settings`` object: only the settings a change can set."""
    b = _map(body, "settings")
    unknown = set(b) - SETTING_NAMES
    if unknown:
        raise Malformed("settings: unknown %s" % ", ".join(sorted(unknown)))
    return ProposedSettings(**b)


def decode_prediction(body: Any) -> Prediction:
    b = _map(body, "a prediction")
    settings = decode_settings(b.get("settings") or {})
    rules_out = tuple(str(x) for x in _list(b, "rules_out"))
    if b.get("workers_alone_useless") and "num_workers" not in rules_out:
        rules_out += ("num_workers",)
    return Prediction(_str(b, "cause") or "", _str(b, "change") or "",
                      settings, _num(b, "predicted_data_wait_ratio") or 0.0,
                      _num(b, "predicted_step_seconds") or 0.0, _num(b, "speedup"),
                      _str(b, "basis") or "", _str(b, "confidence") or "", rules_out,
                      _num(b, "cpu_limit_cores"), _num(b, "crowded_ratio"),
                      _num(b, "first_batch_seconds"), _num(b, "removed_share"),
                      _str(b, "cpu_note"), _str(b, "memory_note"), _str(b, "bound_by"))


def decode_cause(body: Any) -> Cause:
    b = _map(body, "a cause")
    name = _str(b, "cause")
    if not name:
        raise Malformed("a cause has no name")
    return Cause(name, _num(b, "score") or 0.0, _str(b, "summary") or "",
                 tuple(decode_evidence(e) for e in _list(b, "evidence")),
                 _str(b, "kind") or "co_occurrence",
                 decode_prediction(b["prediction"]) if b.get("prediction") else None,
                 decode_worker(b["worker"]) if b.get("worker") else None)


def decode_worker(body: Any) -> WorkerSpread:
    """slow_worker's look at the workers (``worker`` in a cause), as ``worker`` wrote it."""
    b = dict(_map(body, "a cause's worker"))
    try:
        b["workers"] = {int(pid): (float(w["load_seconds"]), int(w["batches"]), float(w["wait_seconds"]))
                        for pid, w in _map(b.get("workers") or {}, "the workers").items()}
    except (KeyError, TypeError, ValueError) as e:
        raise Malformed("a cause's workers: %s" % e) from None
    out: WorkerSpread = _dataclass(WorkerSpread, b, "a cause's worker")
    return out


def _dataclass(cls: Any, body: Any, what: str) -> Any:
    b = _map(body, what)
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in b.items() if k in names})
    except TypeError as e:
        raise Malformed("%s: %s" % (what, e)) from None


def decode_headline(body: Any) -> tuple[str | None, tuple[Cause, ...], Any, Prediction | None]:
    """What every diagnosis body leads with, the agent's and a ``diagnose --json``
    document alike: (the verdict, the causes, the straggler's rank, the prediction)."""
    b = _map(body, "the diagnosis")
    straggler = b.get("straggler")
    prediction = b.get("prediction")
    return (_str(b, "verdict"), tuple(decode_cause(c) for c in _list(b, "causes")),
            _map(straggler, "straggler").get("rank") if straggler else None,
            decode_prediction(prediction) if prediction else None)


def decode(body: Any) -> Diagnosis:
    """The typed Diagnosis of an agent's /api/v1/diagnosis body."""
    b = _map(body, "the diagnosis")
    if b.get("api") != API:
        raise Malformed("api is %r, not %r" % (b.get("api"), API))
    verdict = _str(b, "verdict")
    if verdict not in ("healthy", "input_bound", "not_input_bound", "unknown"):
        raise Malformed("verdict %r is not one of the vocabulary's" % verdict)
    loop = None
    if b.get("data_wait_seconds") is not None:
        loop = Loop(_num(b, "data_wait_seconds") or 0.0, _num(b, "steady_data_wait_ratio") or 0.0,
                    _num(b, "iterator_start_wait_seconds") or 0.0, _num(b, "step_seconds") or 0.0,
                    _num(b, "compute_seconds_per_batch") or 0.0, _num(b, "data_wait_ratio_after_start"),
                    _num(b, "handoff_ratio"))
    gpu = None
    if b.get("gpu") is not None:
        g = _map(b["gpu"], "gpu")
        gpu = GpuView(_str(g, "signal"), _str(g, "source"), _int(g, "samples") or 0,
                      _num(g, "idle_ratio"), _num(g, "idle_without_wait_ratio"))
    s = b.get("straggler")
    straggler = None
    if s is not None:
        s = _map(s, "straggler")
        straggler = Straggler(s.get("rank"), _str(s, "pod"), _str(s, "node"), _num(s, "data_wait_ratio"),
                              _str(s, "note") or "", s.get("hung") is True)
    rows = tuple(RankRow(r.get("rank"), _str(r, "pod"), _num(r, "data_wait_ratio"),
                         _num(r, "data_wait_ratio_after_start"))
                 for r in (_map(x, "a rank row") for x in _list(b, "job_ranks_on_node")))
    det = b.get("detection")
    detection = None
    if det is not None:
        dm = _map(det, "detection")
        detection = Detection(bool(dm.get("stalled")), _int(dm, "since_ns"),
                              _num(dm, "data_wait_ratio") or 0.0, _int(dm, "batches") or 0,
                              _num(dm, "excess_seconds") or 0.0, _num(dm, "z") or 0.0)
    headroom = _dataclass(Headroom, b["headroom"], "headroom") if b.get("headroom") else None
    matched = tuple(_dataclass(Matched, m, "a matched rank") for m in _list(b, "matched_ranks"))
    if b.get("hang") is not None:
        _map(b["hang"], "hang")
    changed = decode_change(b["change"]) if b.get("change") is not None else None
    return Diagnosis(
        who=Identity(_str(b, "job"), b.get("rank"), _str(b, "pod"), _str(b, "namespace"), _str(b, "node")),
        window_seconds=_num(b, "window_seconds") or 0.0, batches=_int(b, "batches") or 0,
        loader=LoaderSettings.from_json(_map(b["loader"], "loader")) if b.get("loader") is not None else None,
        verdict=verdict, reason=_str(b, "reason") or "", rule=_str(b, "rule") or "",
        data_wait_ratio=_num(b, "data_wait_ratio"), job_ranks_on_node=rows, straggler=straggler,
        causes=tuple(decode_cause(c) for c in _list(b, "causes")),
        not_evaluated=tuple(str(x) for x in _list(b, "not_evaluated")), loop=loop, gpu=gpu,
        gpu_idle_overlap_ratio=_num(b, "gpu_idle_overlap_ratio"),
        stall=_dataclass(StallPeriod, b["stall"], "stall") if b.get("stall") else None,
        sawtooth=_dataclass(Sawtooth, b["sawtooth"], "sawtooth") if b.get("sawtooth") else None,
        since_ns=_int(b, "since_ns"), headroom=headroom, detection=detection,
        hang=b.get("hang"), change=changed, matched_ranks=matched, note=_str(b, "note") or "",
        warnings=tuple(_dataclass(SetupWarning, w, "a warning") for w in _list(b, "warnings")),
        checks_unknown=tuple(str(x) for x in _list(b, "checks_unknown")),
        loader_error=(_dataclass(LoaderError, b["loader_error"], "loader_error")
                      if b.get("loader_error") is not None else None),
        budget=decode_budget(b["budget"]) if b.get("budget") is not None else None)
