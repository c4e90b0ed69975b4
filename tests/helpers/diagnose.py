"""Typed builders for diagnose's unit tests: a Subject, a ClusterView, a Report and an
agent's Diagnosis with only the fields a test sets (stallscope/diagnose/document.py)."""
import dataclasses

from stallscope.correlate import causes
from stallscope.correlate.model import Cause, Diagnosis, Evidence, GpuView, Identity
from stallscope.diagnose.document import (
    ClusterView,
    JobRank,
    PodSignal,
    Progress,
    RankInfo,
    Report,
    Sizing,
    Subject,
)


def row(r, pod, node, ratio):
    return JobRank(r, pod, node, ratio)


def subject(r, job_scope="cluster", **kw):
    return Subject(job="j", rank=r.rank, pod=r.pod, namespace="ml", node=r.node,
                   data_wait_ratio=r.data_wait_ratio, job_max=None, job_median=None,
                   job_scope=job_scope, job_ranks=kw.pop("job_ranks", 1), **kw)


def cluster(straggler=None, signals=(), cause_scores=(), sizing=None, **kw):
    base = dict(job="j", rank=0, pod="p", namespace="ml", node="n", data_wait_ratio=None, batches=None,
                pod_ranks=(), job_ranks=1, job_ranks_with_data=1, job_max_data_wait_ratio=None,
                job_median_data_wait_ratio=None, straggler=straggler, top_ranks=(),
                ranks_without_batches=(), since=None, agent_url=None,
                signals=tuple(signals), cause_scores=tuple(cause_scores), sizing=sizing or Sizing(),
                worker_exits=(), death_causes=(), sli_expr="")
    base.update(kw)
    return ClusterView(**base)


def pod_signal(signal, cause, value, threshold, direction="above"):
    return PodSignal(signal, cause, value, threshold, direction, "prometheus", "...")


def diagnosis(verdict="healthy", reason="", gpu=None, **kw):
    return Diagnosis(who=Identity("j", 0, "p", "ml", "n"), window_seconds=900.0, batches=100,
                     loader=None, verdict=verdict, reason=reason,
                     gpu=GpuView(idle_ratio=gpu[0], idle_without_wait_ratio=gpu[1]) if gpu else None, **kw)


def cause(name, score, *signals, summary=""):
    return causes.make(name, score, summary or name + ".", [Evidence(s, None) for s in signals])


def report(**kw):
    base = dict(verdict="input_bound", reason="r", causes=(), job="j", rank=3, pod="p", namespace="ml",
                node="n", data_wait_ratio=None, job_max_data_wait_ratio=None,
                job_median_data_wait_ratio=None, job_scope="node", job_ranks=1, threshold=0.02,
                straggler=None, top_ranks=(), pod_ranks=(), ranks_without_batches=(), since=None,
                window_seconds=900.0, generated_at="", loader=None, sizing=Sizing(), pids=None,
                progress=None, blocked_in_next_seconds=None, worker_deaths=(), worker_exits=(),
                hang=None, gpu=None, stall_period_steps=None, agent_verdict=None, sli_expr=None,
                agent_url=None, prometheus_url=None)
    base.update(kw)
    return Report(**base)


def progress(batches, age, median):
    return Progress(batches, None, age, median)


def info(**kw):
    return RankInfo(job="j", rank=0, pod="p", namespace="ml", node="n", **kw)


replace = dataclasses.replace
__all__ = ["Cause", "row", "subject", "cluster", "pod_signal", "diagnosis", "cause", "report", "progress",
           "info", "replace"]
