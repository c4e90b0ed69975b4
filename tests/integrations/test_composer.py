"""MosaicML Composer with StallscopeCallback and a Mosaic Streaming dataset, end to end on
this machine, in Composer's own venv (make test-composer: mosaicml requires torch<2.7.1,
which the main venv's torch cannot meet, so there it is skipped). The test writes MDS
shards; each fit's StreamingDataset copies them into its own cache. A starved loader is
input_bound with too_few_workers; a fast one is not input_bound; the copies arrive as
shard reads and cache misses of Streaming's own download path."""
import pytest

from stallscope.hook import tiers
from tests.helpers import wait_until
from tests.helpers.frameworks import (
    AGENT_ARGS,
    HEALTHY,
    STARVED,
    Run,
    assert_healthy,
    assert_starved,
    settled_diagnoses,
)

pytest.importorskip("composer", reason="mosaicml (Composer) needs torch<2.7.1: make test-composer")
streaming = pytest.importorskip("streaming", reason="mosaicml-streaming: make test-composer")

SAMPLES = 600  # more than either fit takes: 70 and 45 batches of 8


def write_shards(remote):
    import numpy as np

    with streaming.MDSWriter(out=str(remote), columns={"x": "ndarray:float32:4", "y": "float32"},
                             size_limit=1 << 12) as w:
        for i in range(SAMPLES):
            w.write({"x": np.full(4, i % 7, np.float32), "y": np.float32(i % 3)})
    return sorted(p for p in remote.iterdir() if p.suffix == ".mds")


@pytest.mark.slow
@pytest.mark.frameworks  # minutes: make test-composer, in its own venv
def test_composer_streaming_starved_loader_is_input_bound_and_a_fast_one_is_not(agent_factory, tmp_path):
    agent = agent_factory(*AGENT_ARGS)
    remote = tmp_path / "shards"
    files = write_shards(remote)
    assert len(files) >= 3
    cfg = dict(remote=str(remote))
    runs = [Run("composer_trainer.py", dict(STARVED, local=str(tmp_path / "cache-slow"), **cfg),
                agent, "composer-slow", tmp_path),
            Run("composer_trainer.py", dict(HEALTHY, local=str(tmp_path / "cache-fine"), **cfg),
                agent, "composer-fine", tmp_path)]
    try:
        got = settled_diagnoses(agent, runs, [("composer-slow", 0), ("composer-fine", 0)])
        assert set(got) == {("composer-slow", 0), ("composer-fine", 0)}, sorted(got)
        assert_starved(got[("composer-slow", 0)], STARVED)
        assert_healthy(got[("composer-fine", 0)])
        ranks = {r["job"]: r for r in agent.api("/api/v1/ranks")["ranks"]}
        # the workers' own reports: their PIDs, and batch load times of 8 samples x 60 ms
        slow = ranks["composer-slow"]
        assert len(slow["worker_pids"]) == STARVED["workers"], slow
        injected = STARVED["batch"] * STARVED["sample_s"]
        assert injected <= slow["sizing"]["batch_load_seconds"] < 3 * injected, slow["sizing"]
        # Streaming's copies from the remote into each fit's cache: each shard the fit
        # needed is one read of the remote's tier and one miss; 70 batches need them all,
        # which the download threads may not have copied yet when the verdict settles
        tier = tiers.of_path(remote)

        def copied():
            entry = next(r for r in agent.api("/api/v1/ranks")["ranks"] if r["job"] == "composer-slow")
            got = entry["shard_reads"]["tiers"]
            return got if got.get(tier, {}).get("reads") == len(files) else None
        got_tiers = wait_until(copied, timeout=90, step=1)
        assert got_tiers[tier]["bytes"] == sum(p.stat().st_size for p in files), got_tiers
        assert got_tiers["streaming-cache"]["cache_misses"] == len(files), got_tiers
    finally:
        for r in runs:
            r.stop()
