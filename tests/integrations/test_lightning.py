"""PyTorch Lightning with StallscopeCallback, end to end on this machine: a DDP fit (2 CPU
processes over gloo) on a starved loader has its slower rank input_bound with
too_few_workers and the other waiting for it in the collective (both starve alike; DDP's
all-reduce makes the later one the straggler); a fit on a fast loader is not input_bound."""
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

pytest.importorskip("pytorch_lightning")


@pytest.mark.slow
@pytest.mark.frameworks  # minutes each: make test-frameworks, out of CI's 25 minutes
def test_lightning_ddp_starved_loader_is_input_bound_and_a_fast_one_is_not(agent_factory, tmp_path):
    agent = agent_factory(*AGENT_ARGS)
    starved = dict(STARVED, devices=2)
    runs = [Run("lightning_trainer.py", starved, agent, "pl-slow", tmp_path),
            Run("lightning_trainer.py", dict(HEALTHY, devices=1), agent, "pl-fine", tmp_path)]
    try:
        got = settled_diagnoses(agent, runs, [("pl-slow", 0), ("pl-slow", 1), ("pl-fine", 0)])
        assert set(got) == {("pl-slow", 0), ("pl-slow", 1), ("pl-fine", 0)}, sorted(got)
        # the rank identity came from Lightning's DDP environment
        assert [got[("pl-slow", r)]["rank"] for r in (0, 1)] == [0, 1]
        worst = max((0, 1), key=lambda r: got[("pl-slow", r)]["data_wait_ratio"])
        assert_starved(got[("pl-slow", worst)], starved)
        other = got[("pl-slow", 1 - worst)]
        if other["verdict"] != "input_bound":  # a victim of the straggler: names it
            assert other["verdict"] == "not_input_bound", other
            assert other["straggler"]["rank"] == worst, other["straggler"]
        assert_healthy(got[("pl-fine", 0)])
    finally:
        for r in runs:
            r.stop()
