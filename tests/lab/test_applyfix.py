"""lab/applyfix.py and the scoreboard's apply-fix table, pure: how a predicted change
becomes the rerun's scenario, and how predicted and measured are put side by side."""
import pytest

from stallscope.lab import applyfix, faults, scenarios, scoreboard
from stallscope.lab.job import Unavailable


def test_plan_changes_go_to_the_target():
    s = applyfix.fixed(scenarios.get("too-few-workers"), {"num_workers": 4, "prefetch_factor": 3})
    assert s.real.target == {"sample_sleep_s": 0.06, "workers": 4, "prefetch_factor": 3}
    e = applyfix.fixed(scenarios.get("epoch-start"), {"persistent_workers": True})
    assert e.real.target["persistent_workers"] is True and e.real.target["epoch_batches"] == 20
    # the original scenario is untouched
    assert scenarios.get("epoch-start").real.target["persistent_workers"] is False


def test_a_cpu_limit_replaces_the_quota_also_inside_combined_faults():
    s = applyfix.fixed(scenarios.get("quota-capped"), {"cpu_limit_cores": 0.75, "num_workers": 3})
    f = s.real.fault()
    assert isinstance(f, faults.CpuQuota) and f.cpus == 0.75 and s.real.target["workers"] == 3
    c = applyfix.fixed(scenarios.get("cpu-crowded-quota"), {"cpu_limit_cores": 3.0}).real.fault()
    assert isinstance(c, faults.Combined)
    assert [type(p) for p in c.parts] == [faults.CpuQuota, faults.CpuHogs] and c.parts[0].cpus == 3.0


def test_a_larger_shm_keeps_the_leftovers():
    f = applyfix.fixed(scenarios.get("shm-exhaustion"), {"shm_mib": 64}).real.fault()
    assert (f.size_mib, f.leftover_mib) == (64, scenarios.get("shm-exhaustion").real.fault().leftover_mib)


def test_what_the_lab_cannot_apply_is_refused_not_faked():
    with pytest.raises(Unavailable, match="CpuQuota"):
        applyfix.fixed(scenarios.get("too-few-workers"), {"cpu_limit_cores": 1.0})
    with pytest.raises(Unavailable, match="cannot apply"):
        applyfix.fixed(scenarios.get("too-few-workers"), {"cache_gib": 4})


def _run(target_wait, target_step_s, peer_wait, batches=100):
    return {"target_rank": 1, "ranks": [
        {"rank": 0, "batches": batches, "step_seconds": target_step_s * batches,
         "data_wait_ratio": peer_wait},
        {"rank": 1, "batches": batches, "step_seconds": target_step_s * batches,
         "data_wait_ratio": target_wait}]}


def test_compare_puts_the_machine_beside_the_prediction():
    p = {"cause": "too_few_workers", "change": "raise num_workers from 2 to 4",
         "settings": {"num_workers": 4}, "predicted_data_wait_ratio": 0.003, "predicted_step_seconds": 0.16}
    before, after = _run(0.3, 0.24, 0.01), _run(0.05, 0.2, 0.07)
    out = applyfix.compare(p, after, before)
    assert out["measured_step_seconds"] == pytest.approx(0.2)
    assert out["step_error"] == pytest.approx((0.16 - 0.2) / 0.2)
    assert out["stall_gone"] is False
    # the healthy rank waited more than the fixed one: the machine's floor
    assert out["peers_data_wait_ratio"] == pytest.approx(0.07)
    # compute per step: 0.24 x 0.7 = 0.168 before, 0.2 x 0.95 = 0.19 after
    assert out["compute_change"] == pytest.approx(0.19 / 0.168 - 1, abs=1e-4)
    text = applyfix.render(out)
    assert "NOT gone" in text and "without the fault waited 7.0%" in text and "+13.1%" in text


def test_the_scoreboard_adds_the_fix_table_only_when_asked():
    plain = {"expected": {"cause": "too_few_workers", "rank": 1},
             "found": {"cause": "too_few_workers", "rank": 1}, "alerts": None,
             "ranks": [{"data_wait_ratio": 0.3}], "ok": True}
    assert "wait pred/meas" not in scoreboard.render([scoreboard.row("too-few-workers", plain)])
    p = {"cause": "too_few_workers", "change": "raise num_workers from 2 to 4",
         "settings": {"num_workers": 4}, "predicted_data_wait_ratio": 0.003, "predicted_step_seconds": 0.16}
    good = dict(plain, fix=applyfix.compare(p, _run(0.01, 0.17, 0.01), _run(0.3, 0.24, 0.01)))
    bad = dict(plain, fix={"error": "the lab cannot apply cache_gib=4"})
    out = scoreboard.render([scoreboard.row("too-few-workers", good), scoreboard.row("cold-cache", bad)])
    table = out.split("\n\n", 1)[1].splitlines()
    assert "wait pred/meas" in table[0]
    assert table[2].split()[:1] == ["too-few-workers"] and "0.3%/1.0%" in table[2]
    assert "0.160s/0.170s" in table[2] and "-5.9%" in table[2]
    assert "no rerun: the lab cannot apply" in table[3]
    assert table[4].startswith("1/1 fixes took the wait under the 2% line, 1 within 15%")


def test_the_rerun_window_opens_after_the_changed_loaders_queue_fill():
    # the prediction's replay leaves out the queue's first two rounds; the rerun's
    # measured window does too, for the loader as changed (5 workers, prefetch 2: 20)
    from stallscope.lab.runner import Options
    seen = []
    prediction = {"cause": "too_few_workers", "change": "raise num_workers from 2 to 5",
                  "settings": {"num_workers": 5}, "predicted_data_wait_ratio": 0.0,
                  "predicted_step_seconds": 0.154}

    def run_one(scenario, opts):
        seen.append((scenario.real.target.get("workers"), opts.warmup_batches, opts.record))
        r = _run(0.4, 0.26, 0.01) if len(seen) == 1 else _run(0.01, 0.155, 0.007)
        r.update(diagnosis={"report": {"prediction": prediction}}, found={"cause": "too_few_workers"},
                 ok=True)
        return r

    out = applyfix.run(scenarios.get("variable-cost"), Options(record="/tmp/x"), run_one)
    assert seen == [(None, 1, "/tmp/x"), (5, 20, None)]
    assert out["fix"]["stall_gone"] is True
    # a CPU limit's third run (twice the workers under the old quota) fills its own queue
    seen.clear()
    prediction.update(settings={"cpu_limit_cores": 0.55}, change="raise the CPU limit to 0.55 cores")
    applyfix.run(scenarios.get("quota-capped"), Options(), run_one)
    assert [s[1] for s in seen] == [1, 8, 16]
