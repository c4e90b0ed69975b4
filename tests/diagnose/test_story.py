"""One story per report (issue 29, item 5): the next steps, the prediction and the
headline come from the same ranked, typed causes, and a next step never recommends what
the top cause's prediction says will not help. The two contradictions measured on runs
built outside the lab, then a property over generated diagnoses."""
import dataclasses
import random

import numpy as np

from stallscope import vocabulary
from stallscope.correlate import diagnosis, predict
from stallscope.correlate.model import Prediction, ProposedSettings
from stallscope.correlate.queue import Measured
from stallscope.diagnose import nextsteps, outlook
from stallscope.diagnose.document import Sizing
from stallscope.report import LoaderSettings
from tests.helpers.correlate import events_from_waits, trace_of
from tests.helpers.diagnose import cause, replace, report


def _report_of(d, **kw):
    return report(verdict=d.verdict, causes=d.causes, prediction=outlook.prediction(d.verdict, d),
                  loader=d.loader, **kw)


def test_num_workers_0_gets_a_worker_prediction_and_the_step_says_the_same():
    # the training process loads each batch itself (0.3 s) before 0.1 s of compute
    d = diagnosis.analyse(trace_of(events_from_waits([0.3] * 120, compute_s=0.1), workers=0))
    assert d.verdict == "input_bound" and d.top_cause == "too_few_workers"
    p = d.prediction
    assert p is not None and p.configured, p  # it was "cut the per-sample work", no setting
    need = p.settings.num_workers
    assert 3 <= need <= 5  # 0.3 s of load a batch over 0.1 s of compute: ceil(3) .. with spread
    assert p.change == "raise num_workers from 0 to %d" % need
    steps = nextsteps.steps(_report_of(d, sizing=Sizing(num_workers=0, workers_needed=2)))
    assert steps[0].step.startswith("Raise num_workers from 0 to %d: predicted data-wait" % need)
    assert not any("from 0 to 2" in s.step for s in steps)  # the sizing rule's count is not beside it


def _crowded():
    """A rank whose workers wait for a core on a crowded node, with no quota."""
    rng = np.random.default_rng(3)
    load = rng.uniform(0.35, 0.45, 200)
    return Measured(step_seconds=0.2, compute=np.full(200, 0.1), data_wait_ratio=0.5, load=load,
                    workers=2, prefetch=2, workers_cpu_cores=1.0, runqueue_ratio=0.6,
                    waits=np.full(200, 0.1))


def test_a_cpu_contention_report_never_leads_with_more_workers():
    # issue 29: cpu_contention first (its prediction: more workers do not help), and the
    # loader sizing, fed by load times the crowded CPUs stretched, asking for 3 workers:
    # the first next step was "Raise num_workers from 2 to 3"
    m = _crowded()
    top = replace(cause("cpu_contention", 0.8, "workers_runqueue_ratio"),
                  prediction=predict.for_cause("cpu_contention", m))
    second = replace(cause("too_few_workers", 0.3), prediction=predict.for_cause("too_few_workers", m))
    assert "num_workers" in top.prediction.rules_out
    d = report(causes=(top, second, cause("unexplained", 0.2)), prediction=top.prediction,
               sizing=Sizing(num_workers=2, workers_needed=3))
    steps = nextsteps.steps(d)
    assert steps[0].step.startswith(vocabulary.cause("cpu_contention").advice[:40])
    assert not any("num_workers from" in s.step for s in steps), steps


def _prediction(rng, name):
    settings = ProposedSettings(**rng.choice([
        {}, {"num_workers": rng.randint(1, 16)}, {"cpu_limit_cores": 2.5}, {"persistent_workers": True},
        {"num_workers": 4, "cpu_limit_cores": 3.0}]))
    rules = tuple(rng.sample(["num_workers", "cpu_limit_cores"], rng.randint(0, 2)))
    change = ", ".join("set %s to %s" % kv for kv in settings.items()) or "cut the per-sample work"
    return Prediction(name, change, settings, rng.random() * 0.1, rng.uniform(0.05, 1), 1.5, "b",
                      rng.choice(["high", "medium", "upper bound"]), rules_out=rules)


def test_no_next_step_recommends_what_the_top_prediction_rules_out():
    rng = random.Random(29)
    names = [c.name for c in vocabulary.CAUSES if c.name != "unexplained"]
    for _ in range(5000):
        chosen = rng.sample(names, rng.randint(1, 4))
        causes = sorted((replace(cause(n, round(rng.random(), 4)),
                                 prediction=_prediction(rng, n) if rng.random() < 0.7 else None)
                         for n in chosen), key=lambda c: -c.score)
        sizing = Sizing(num_workers=rng.randint(0, 8), workers_needed=rng.choice([None, rng.randint(1, 12)]),
                        quota_limited=rng.random() < 0.3)
        d = report(causes=tuple(causes), prediction=causes[0].prediction, sizing=sizing,
                   job_ranks=rng.randint(1, 4))
        steps = nextsteps.steps(d)
        banned = set(causes[0].prediction.rules_out) if causes[0].prediction else set()
        texts = " | ".join(s.step for s in steps)
        if "num_workers" in banned:
            assert "Raise num_workers" not in texts and "num_workers from" not in texts, (causes, texts)
        if "cpu_limit_cores" in banned:
            assert "cpu_limit_cores to" not in texts, texts
        # the report's prediction is its top cause's; a modelled, allowed change leads its step
        assert d.prediction is causes[0].prediction
        for c, s in zip([c for c in causes if c.score >= vocabulary.ATTRIBUTE][:2] or causes[:1], steps):
            p = c.prediction
            if p is not None and p.configured and not p.settings.names() & banned:
                assert s.step.startswith(p.change[0].upper() + p.change[1:]), (c, s)
        # one rank: no worst-against-median step
        if d.job_ranks == 1:
            assert not any("median rank" in s.step for s in steps)


def test_every_cause_with_a_configuration_fix_gets_a_prediction_zero_workers_included():
    rng = np.random.default_rng(7)
    for workers in range(0, 6):
        # each batch takes (workers + 2) x the compute to load: these workers fall short
        load = rng.uniform(0.9, 1.1, 100) * 0.1 * (workers + 2)
        m = Measured(step_seconds=0.3, compute=np.full(100, 0.1), data_wait_ratio=0.6,
                     load=load if workers else None, workers=workers, prefetch=2,
                     waits=load, iterator_starts=2, iterator_start_wait_seconds=3.0,
                     steady_wait_seconds=0.2, batches=100, persistent=False)
        for name in predict.MODELS:
            p = predict.for_cause(name, m)
            assert p.cause == name and p.predicted_step_seconds > 0
        p = predict.for_cause("too_few_workers", m)
        assert p.configured and p.settings.num_workers > workers, (workers, p)


def test_the_steps_never_ask_for_a_setting_the_loader_already_has():
    """Issue 49: a shm-exhaustion report's second step said "set persistent_workers=True",
    which it already was (too_few_workers' advice, its workers ruled out)."""
    m = _crowded()
    ruled = replace(cause("too_few_workers", 0.6), prediction=predict.for_cause("cpu_contention", m))
    loader = LoaderSettings(num_workers=2, persistent_workers=True)
    d = report(causes=(cause("shm_exhaustion", 0.8), ruled), loader=loader, sizing=Sizing(num_workers=2))
    texts = [s.step for s in nextsteps.steps(d)]
    assert not any("persistent_workers=True" in t for t in texts), texts
    d = report(causes=(cause("shm_exhaustion", 0.8), ruled),
               loader=dataclasses.replace(loader, persistent_workers=False), sizing=Sizing(num_workers=2))
    assert any("Set persistent_workers=True" in s.step for s in nextsteps.steps(d))
