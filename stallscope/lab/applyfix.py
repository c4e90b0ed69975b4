"""``stallscope lab run SCENARIO --apply-fix``: run the scenario, take diagnose's
prediction for the faulty rank, run it again with that change applied, and put the
prediction beside what the second run measured (issue 17).

A change is applied as the trainer's plan or the fault would carry it: ``num_workers``
becomes the target's ``workers``, ``prefetch_factor`` its ``prefetch_factor``,
``persistent_workers`` its ``persistent_workers`` (lab/trainer.py restarts the iterator
each ``epoch_batches``), a CPU limit the CFS quota of its workers' cgroup, ``shm_mib`` the
size of its own /dev/shm (the leftovers stay). A change the lab cannot apply is reported,
not faked. Where the prediction names a CPU limit instead of more workers, a third run
doubles the workers under the old quota, to show that they alone do not fix it; so
does one where it names a faster link. Only
the first run is recorded (``--record``): the reruns are not the scenario any more.
"""
import dataclasses

from ..vocabulary import DATA_WAIT_LINE
from . import faults
from .job import Unavailable

PLAN_KEYS = {"num_workers": "workers", "prefetch_factor": "prefetch_factor",
             "persistent_workers": "persistent_workers"}


def prediction_of(result):
    """The prediction diagnose made for the rank it named, or None."""
    details = result.get("diagnosis")
    report = details.get("report") if isinstance(details, dict) else None
    return (report or {}).get("prediction")


def fixed(scenario, settings):
    """The scenario with ``settings`` applied to the target, or raise Unavailable."""
    real = scenario.real
    target = dict(real.target)
    fault = real.fault
    for key, value in settings.items():
        if key in PLAN_KEYS:
            target[PLAN_KEYS[key]] = value
        elif key == "cpu_limit_cores":
            fault = _replaced(fault, faults.CpuQuota, lambda old, v=value: faults.CpuQuota(v), scenario,
                              "a CPU limit")
        elif key == "link_capacity_bytes_per_second":
            fault = _replaced(fault, faults.ShapedStore, lambda old, v=value: faults.ShapedStore(
                rate=v, latency=old.latency, read_kib=old.read_kib, reads=old.reads,
                error_rate=old.error_rate, timed=old.timed), scenario, "a link's capacity")
        elif key == "shm_mib":
            fault = _replaced(fault, faults.TinyShm, lambda old, v=value: faults.TinyShm(
                size_mib=v, leftover_mib=old.leftover_mib, sample_kib=old.sample_kib),
                scenario, "a /dev/shm size")
        else:
            raise Unavailable("%s: the lab cannot apply %s=%r" % (scenario.name, key, value))
    # the fix changes the set-up: its checks are not the scenario's (None: not judged)
    return dataclasses.replace(scenario, real=dataclasses.replace(real, target=target, fault=fault,
                                                                  warns=None))


def _replaced(make_fault, kind, new, scenario, what):
    """A fault factory like ``make_fault`` whose ``kind`` part is ``new(old part)`` (in a
    Combined fault too), or raise Unavailable when the scenario has no such part."""
    fault = make_fault()
    parts = fault.parts if isinstance(fault, faults.Combined) else (fault,)
    if not any(isinstance(p, kind) for p in parts):
        raise Unavailable("%s: the lab applies %s only to a %s fault" % (scenario.name, what, kind.__name__))

    def make():
        fresh = make_fault()
        got = [new(p) if isinstance(p, kind) else p
               for p in (fresh.parts if isinstance(fresh, faults.Combined) else (fresh,))]
        return faults.Combined(*got) if isinstance(fresh, faults.Combined) else got[0]
    return make


def queue_fill(scenario):
    """Batches before the rerun's window opens: the loader's first two rounds of its
    queue (2 x prefetch x workers), which the prediction's replay leaves out as start-up
    too. Counted from the first batch, a 25 s window weighs that one-off fill twelve
    times as much as the alert's 5 minutes do: the variable-cost rerun with 5 workers
    waited 3.2 % in it, all of it for a costly second batch started with the first
    (the same 2.7 % with 5, 6 or 8 workers in a replay of the lab's fixed draws)."""
    plan = dict(scenario.real.everyone, **scenario.real.target)
    return 2 * plan.get("prefetch_factor", 2) * max(1, plan.get("workers", 2))


def measured(result):
    """(data-wait share, mean step seconds) of the run's faulty rank."""
    row = next(r for r in result["ranks"] if r["rank"] == result["target_rank"])
    step = row["step_seconds"] / row["batches"] if row.get("batches") else None
    return row.get("data_wait_ratio"), step


def peers_wait(result):
    """The most any rank without the fault waited in the same run: the machine's floor
    (a crowded machine starves the healthy loaders too), or None in a one-rank run."""
    waits = [r.get("data_wait_ratio") for r in result["ranks"] if r["rank"] != result["target_rank"]]
    waits = [w for w in waits if w is not None]
    return max(waits) if waits else None


def _compute(wait, step):
    return step * (1 - wait) if wait is not None and step else None


def compare(prediction, after, before=None, workers_alone=None):
    wait, step = measured(after)
    pred = prediction["predicted_step_seconds"]
    out = {"cause": prediction.get("cause"), "change": prediction["change"],
           "settings": prediction.get("settings"),
           "predicted_data_wait_ratio": prediction["predicted_data_wait_ratio"],
           "predicted_step_seconds": pred, "measured_data_wait_ratio": wait,
           "measured_step_seconds": round(step, 6) if step else None,
           "step_error": round((pred - step) / step, 4) if step else None,
           "stall_gone": wait is not None and wait < DATA_WAIT_LINE}
    out["peers_data_wait_ratio"] = peers_wait(after)
    if before is not None:
        out["before_data_wait_ratio"], b = measured(before)
        out["before_step_seconds"] = round(b, 6) if b else None
        # the step without its wait, before and after: the prediction keeps the compute
        # measured before, so a change of it between the runs is the machine's, not the model's
        was, now = _compute(out["before_data_wait_ratio"], b), _compute(wait, step)
        if was and now:
            out["compute_change"] = round(now / was - 1, 4)
    if workers_alone is not None:
        w, s = measured(workers_alone)
        out["workers_alone"] = {"data_wait_ratio": w, "step_seconds": round(s, 6) if s else None}
    return out


def run(scenario, opts, run_one):
    """``run_one(scenario, opts)`` is runner.run; returns the first run's result with
    ``fix`` (compare()'s numbers, or {"error"}) and ``after`` (the second run's result)."""
    first = run_one(scenario, opts)
    p = prediction_of(first)
    if not p or not p.get("settings"):
        first["fix"] = {"error": "diagnose made no prediction with a configuration change"
                                 " (cause %s)" % ((p or {}).get("cause") or first["found"]["cause"])}
        return first
    try:
        after_scenario = fixed(scenario, p["settings"])
    except Unavailable as e:
        first["fix"] = {"error": str(e), "change": p["change"]}
        return first
    rerun = dataclasses.replace(opts, record=None, warmup_batches=queue_fill(after_scenario))
    after = run_one(after_scenario, rerun)
    alone = None
    # a larger CPU limit or link: a third run doubles the workers under the old one, to
    # show that they alone do not fix it
    if {"cpu_limit_cores", "link_capacity_bytes_per_second"} & set(p["settings"]):
        plan = dict(scenario.real.everyone, **scenario.real.target)
        workers = 2 * plan.get("workers", 2)
        more = fixed(scenario, {"num_workers": workers})
        alone = run_one(more, dataclasses.replace(rerun, warmup_batches=queue_fill(more)))
    first["fix"] = compare(p, after, first, alone)
    first["after"] = {k: after[k] for k in ("ranks", "found", "ok")}
    return first


def render(fix):
    if fix.get("error"):
        return "apply-fix: %s\n" % fix["error"]
    text = ("apply-fix: %s (%s)\n  before:    data-wait %s, step %s\n  predicted: data-wait %s, step %s\n"
            "  measured:  data-wait %s, step %s  (step error %s; stall %s)\n" % (
                fix["change"], fix["cause"], _pc(fix.get("before_data_wait_ratio")),
                _s(fix.get("before_step_seconds")), _pc(fix["predicted_data_wait_ratio"]),
                _s(fix["predicted_step_seconds"]), _pc(fix["measured_data_wait_ratio"]),
                _s(fix["measured_step_seconds"]), _pc(fix["step_error"]),
                "gone" if fix["stall_gone"] else "NOT gone"))
    if fix.get("peers_data_wait_ratio") is not None or fix.get("compute_change") is not None:
        text += "  the machine: ranks without the fault waited %s after; compute per step %s\n" % (
            _pc(fix.get("peers_data_wait_ratio")), _signed(fix.get("compute_change")))
    if fix.get("workers_alone"):
        w = fix["workers_alone"]
        text += "  more workers alone (old quota or link): data-wait %s, step %s\n" % (
            _pc(w["data_wait_ratio"]), _s(w["step_seconds"]))
    return text


def _pc(x):
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def _signed(x):
    return "n/a" if x is None else "%+.1f%%" % (100 * x)


def _s(x):
    return "n/a" if x is None else "%.3gs" % x
