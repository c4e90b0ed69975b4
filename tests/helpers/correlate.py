"""Small builders shared by the correlator's unit tests."""
import numpy as np

from stallscope.correlate.trace import RankTrace
from stallscope.lab import synth

SEC = synth.SEC


def events_from_waits(waits_s, compute_s=0.1, t0_s=100.0):
    """Batch events for a loop that waits waits_s[k] then computes compute_s."""
    t = int(t0_s * SEC)
    out, prev = [], None
    for w in waits_s:
        end = t + int(w * SEC)
        out.append((end, end - t, end - prev if prev is not None else end - t))
        prev = end
        t = end + int(compute_s * SEC)
    return out


def trace_of(events, workers=4, signals=None, node_signals=None, gpu=None, rank=0, job="t"):
    return RankTrace.from_timeline(synth.body(events, rank=rank, job=job, workers=workers,
                                              signals=signals, node_signals=node_signals, gpu=gpu))


def simulated(seed, workers, load, compute, n=800, **kw):
    rng = np.random.default_rng(seed)
    j = synth.jitter(rng, 0.05)
    return synth.simulate(n, workers, lambda k, t: j(load), lambda k, t: j(compute), **kw)


def report(job, rank, pod, events, workers=2):
    """A trainer's report as the agent's validation makes it (HookReport), its events
    from rows."""
    from stallscope.host.report import HookReport

    return HookReport.of({"id": {"job": job, "rank": rank, "local_rank": rank, "world_size": 2, "pod": pod,
                   "namespace": "ns", "node": ""},
            "role": "main", "pid": 1000 + rank, "mono_ns": 0, "wall_ns": 0, "dropped_total": 0, "raw": {},
            "loader": {"num_workers": workers, "prefetch_factor": 2, "pin_memory": False,
                       "persistent_workers": True, "batch_size": 8, "worker_pids": []},
            "events": [list(e) for e in events]})


def wire(x):
    """A typed analysis result as the API's JSON (stallscope/correlate/codec.py), so a test
    reads what /api/v1/diagnosis serves: a Diagnosis, a Cause, a Prediction, a Headroom,
    a list of them, or None."""
    import dataclasses

    from stallscope.correlate import codec, model
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [wire(v) for v in x]
    if isinstance(x, model.Diagnosis):
        return codec.encode(x)
    if isinstance(x, model.Cause):
        return codec.cause(x)
    if isinstance(x, model.Prediction):
        return codec.prediction(x)
    if isinstance(x, model.Evidence):
        return codec.evidence(x)
    if dataclasses.is_dataclass(x):
        return codec._fields(x)
    return x


def cause(name, score, summary=None, signal="s", scope="rank"):
    """A typed Cause for the ranking's unit tests."""
    from stallscope.correlate import causes
    from stallscope.correlate.model import Evidence
    return causes.make(name, score, summary if summary is not None else name + ".",
                       [Evidence(signal, None, scope=scope)])
