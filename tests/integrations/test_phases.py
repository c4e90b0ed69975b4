"""Step phases from the frameworks' own hooks (issue 34, item 7): a Lightning and a
Hugging Face Trainer run whose step is compute-heavy (50 ms forward, 200 ms backward, on a
loader that keeps ahead) report forward, backward and the optimizer step, which with the
data-wait sum to the step time within 5 %, and the report names the backward's share."""
import pytest

from tests.helpers.frameworks import AGENT_ARGS, HEALTHY, Run, settled_diagnoses

HEAVY = dict(HEALTHY, compute_s=0.05, backward_s=0.2, batches=60)


def _phases_of(agent, job):
    entry = next(r for r in agent.api("/api/v1/ranks")["ranks"] if r["job"] == job)
    return entry, entry["phases"]


def _assert_split(entry, phases, cfg):
    assert phases is not None and phases["steps"] >= 30, entry
    per_step = {k[:-8]: phases[k] / phases["steps"] for k in phases if k.endswith("_seconds")}
    n = entry["batches"]
    wait = entry["data_wait_seconds_total"] / n
    # a batch's interval runs from the previous batch's end: the first holds only its wait,
    # so n batches hold n waits and n - 1 steps' work
    work = (entry["step_seconds_total"] - entry["data_wait_seconds_total"]) / (n - 1)
    step = work + wait
    print("%s: step %.3fs = wait %.3fs + %s" % (entry["job"], step, wait, ", ".join(
        "%s %.3fs" % kv for kv in sorted(per_step.items()))))
    # the injected sleeps: each phase at least what was put in it, and not much more
    assert cfg["backward_s"] <= per_step["backward"] < cfg["backward_s"] + 0.1, per_step
    assert cfg["compute_s"] <= per_step["forward"] < cfg["compute_s"] + 0.1, per_step
    assert 0 <= per_step["optimizer"] < 0.05, per_step
    # the phases and the data-wait account for the step (the rest: the framework's own
    # bookkeeping between hooks, the fetch's call)
    assert abs(sum(per_step.values()) + wait - step) <= 0.05 * step, (step, wait, per_step)


@pytest.mark.slow
@pytest.mark.frameworks
def test_lightning_step_phases_sum_to_the_step(agent_factory, tmp_path):
    pytest.importorskip("pytorch_lightning")
    agent = agent_factory(*AGENT_ARGS)
    run = Run("lightning_trainer.py", dict(HEAVY, devices=1), agent, "pl-phases", tmp_path)
    try:
        got = settled_diagnoses(agent, [run], [("pl-phases", 0)])
        assert ("pl-phases", 0) in got
        _assert_split(*_phases_of(agent, "pl-phases"), HEAVY)
    finally:
        run.stop()


@pytest.mark.slow
@pytest.mark.frameworks
def test_hf_trainer_step_phases_sum_to_the_step(agent_factory, tmp_path):
    pytest.importorskip("transformers")
    agent = agent_factory(*AGENT_ARGS)
    run = Run("hf_trainer.py", dict(HEAVY, mode="trainer"), agent, "hf-phases", tmp_path)
    try:
        got = settled_diagnoses(agent, [run], [("hf-phases", 0)])
        assert ("hf-phases", 0) in got
        _assert_split(*_phases_of(agent, "hf-phases"), HEAVY)
    finally:
        run.stop()
