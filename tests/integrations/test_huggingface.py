"""Hugging Face, end to end on this machine: transformers' Trainer with StallscopeCallback
and a plain accelerate loop over a watch_prepared loader. A starved loader is
input_bound with too_few_workers; a fast one is not input_bound."""
import pytest

from tests.helpers.frameworks import (
    AGENT_ARGS,
    HEALTHY,
    STARVED,
    Run,
    assert_healthy,
    assert_starved,
    settled_diagnoses,
)

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@pytest.mark.slow
@pytest.mark.frameworks  # minutes each: make test-frameworks, out of CI's 25 minutes
@pytest.mark.parametrize("mode", ["trainer", "accelerate"])
def test_hf_starved_loader_is_input_bound_and_a_fast_one_is_not(agent_factory, tmp_path, mode):
    agent = agent_factory(*AGENT_ARGS)
    runs = [Run("hf_trainer.py", dict(STARVED, mode=mode), agent, "hf-slow", tmp_path),
            Run("hf_trainer.py", dict(HEALTHY, mode=mode), agent, "hf-fine", tmp_path)]
    try:
        got = settled_diagnoses(agent, runs, [("hf-slow", 0), ("hf-fine", 0)])
        assert set(got) == {("hf-slow", 0), ("hf-fine", 0)}, sorted(got)
        assert_starved(got[("hf-slow", 0)], STARVED)
        # the workers' own reports came through accelerate's generator (hook/claim.py):
        # their PIDs, and batch load times of 8 samples x 60 ms
        entry = next(r for r in agent.api("/api/v1/ranks")["ranks"] if r["job"] == "hf-slow")
        assert len(entry["worker_pids"]) == STARVED["workers"], entry
        load = entry["sizing"]["batch_load_seconds"]
        injected = STARVED["batch"] * STARVED["sample_s"]
        assert injected <= load < 3 * injected, entry
        assert_healthy(got[("hf-fine", 0)])
    finally:
        for r in runs:
            r.stop()
