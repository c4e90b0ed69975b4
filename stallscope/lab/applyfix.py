"""``stallscope lab run SCENARIO --apply-fix``: run the scenario, take diagnose's
prediction for the faulty rank, run it again with that change applied, and put the
prediction beside what the second run measured (issue 17).

A change is applied as the trainer's plan or the fault would carry it: ``num_workers``
becomes the target's ``workers``, ``prefetch_factor`` its ``prefetch_factor``, a CPU
limit the CFS quota of its workers' cgroup. A change the lab cannot apply (a larger
/dev/shm, persistent workers on a single-epoch run) is reported, not faked. Where the
prediction names a CPU limit instead of more workers, a third run doubles the workers
under the old quota, to show that they alone do not fix it.
"""
import dataclasses

from ..vocabulary import DATA_WAIT_LINE
from . import faults
from .job import Unavailable

PLAN_KEYS = {"num_workers": "workers", "prefetch_factor": "prefetch_factor"}


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
            if not isinstance(real.fault(), faults.CpuQuota):
                raise Unavailable("%s: the lab applies a CPU limit only to a CpuQuota fault" % scenario.name)
            fault = _quota(value)
        else:
            raise Unavailable("%s: the lab cannot apply %s=%r" % (scenario.name, key, value))
    return dataclasses.replace(scenario, real=dataclasses.replace(real, target=target, fault=fault))


def _quota(cores):
    return lambda: faults.CpuQuota(cores)


def measured(result):
    """(data-wait share, mean step seconds) of the run's faulty rank."""
    row = next(r for r in result["ranks"] if r["rank"] == result["target_rank"])
    step = row["step_seconds"] / row["batches"] if row.get("batches") else None
    return row.get("data_wait_ratio"), step


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
    if before is not None:
        out["before_data_wait_ratio"], b = measured(before)
        out["before_step_seconds"] = round(b, 6) if b else None
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
    after = run_one(after_scenario, opts)
    alone = None
    if "cpu_limit_cores" in p["settings"]:
        plan = dict(scenario.real.everyone, **scenario.real.target)
        workers = 2 * plan.get("workers", 2)
        alone = run_one(fixed(scenario, {"num_workers": workers}), opts)
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
    if fix.get("workers_alone"):
        w = fix["workers_alone"]
        text += "  more workers alone (old quota): data-wait %s, step %s\n" % (
            _pc(w["data_wait_ratio"]), _s(w["step_seconds"]))
    return text


def _pc(x):
    return "n/a" if x is None else "%.1f%%" % (100 * x)


def _s(x):
    return "n/a" if x is None else "%.3gs" % x
