"""The loaders users run (issue 34, item 6), each in a real training loop against a real
agent, fed by samples that take 60 ms (STARVED: 2 workers, 8 a batch, 150 ms of compute,
so ~37 % of each step waits). Needs the `loaders` extra: `make test-frameworks`."""
import json

import pytest

from tests.helpers.frameworks import AGENT_ARGS, STARVED, Run, assert_starved, settled_diagnoses


def _run(agent_factory, tmp_path, loader, cfg=STARVED, min_batches=30):
    agent = agent_factory(*AGENT_ARGS)
    job = "ld-" + loader.replace("_", "-")
    run = Run("loaders_trainer.py", dict(cfg, loader=loader), agent, job, tmp_path)
    try:
        got = settled_diagnoses(agent, [run], [(job, 0)], min_batches=min_batches)
        assert (job, 0) in got, "no settled diagnosis of %s" % job
        entry = next(r for r in agent.api("/api/v1/ranks")["ranks"] if r["job"] == job)
        return got[(job, 0)], entry, run
    except BaseException:
        run.stop()
        raise


def _result(run):
    with open(run.cfg["out"] + ".json") as f:
        return json.load(f)


def _assert_workers_seen(entry, cfg):
    """The workers' own reports: their PIDs and batch load times of batch x sample_s."""
    assert len(entry["worker_pids"]) == cfg["workers"], entry
    load = entry["sizing"]["batch_load_seconds"]
    injected = cfg["batch"] * cfg["sample_s"]
    assert injected <= load < 3 * injected, entry


@pytest.mark.slow
@pytest.mark.frameworks
def test_stateful_dataloader_is_diagnosed_and_resumes_through_the_proxy(agent_factory, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    body, entry, run = _run(agent_factory, tmp_path, "stateful")
    try:
        assert_starved(body, STARVED)
        _assert_workers_seen(entry, STARVED)
        assert entry["loader"]["batch_size"] == STARVED["batch"], entry["loader"]
        # the ready/transfer split reached the agent: the wait is mostly for ready batches
        assert body["steady_data_wait_ratio"] > 0, body
    finally:
        run.stop()
    result = _result(run)
    # state_dict() through the watched proxy, load_state_dict() on a new watched loader:
    # the resumed loader serves the samples after the half it had served, once each
    want = [k * STARVED["batch"] for k in range(STARVED["batches"])]
    assert result["first_indices"] == want, result


@pytest.mark.slow
@pytest.mark.frameworks
def test_litdata_streaming_dataloader_is_diagnosed_with_its_workers(agent_factory, tmp_path):
    pytest.importorskip("litdata")
    # litdata starts its workers by spawn: ~2.7 s before the first batch here (measured),
    # which outweighs 30 batches' steady wait (epoch_start); judged once the steady state
    # holds most of the window
    cfg = dict(STARVED, batches=130)
    body, entry, run = _run(agent_factory, tmp_path, "litdata", cfg, min_batches=90)
    try:
        assert_starved(body, cfg)
        _assert_workers_seen(entry, cfg)
    finally:
        run.stop()


@pytest.mark.slow
@pytest.mark.frameworks
def test_hf_datasets_streaming_is_diagnosed_with_its_workers(agent_factory, tmp_path):
    pytest.importorskip("datasets")
    body, entry, run = _run(agent_factory, tmp_path, "hf_streaming")
    try:
        assert_starved(body, STARVED)
        _assert_workers_seen(entry, STARVED)
    finally:
        run.stop()


@pytest.mark.slow
@pytest.mark.frameworks
def test_torchdata_nodes_settings_and_a_bare_data_wait(agent_factory, tmp_path):
    pytest.importorskip("torchdata.nodes")
    body, entry, run = _run(agent_factory, tmp_path, "nodes")
    try:
        assert body["verdict"] == "input_bound", json.dumps(body)
        # the graph's settings: the ParallelMapper's threads and the Batcher's size
        assert entry["loader"]["num_workers"] == STARVED["workers"], entry["loader"]
        assert entry["loader"]["batch_size"] == STARVED["batch"], entry["loader"]
        assert entry["worker_pids"] == [], entry  # threads: nothing the hook sees
    finally:
        run.stop()
    log = open(run.log.name).read()
    assert log.count("is not a torch DataLoader") == 1, log[-2000:]


# Ray Data's rows of 30 ms through one map task, 8 a batch, for two training workers:
# ~480 ms of loading a batch pair against 50 ms of compute each
RAY = dict(workers=2, batch=8, sample_s=0.03, compute_s=0.05, batches=60)


@pytest.mark.slow
@pytest.mark.frameworks
def test_ray_train_ranks_from_its_context_and_a_bare_data_wait(agent_factory, tmp_path):
    pytest.importorskip("ray.train")
    agent = agent_factory(*AGENT_ARGS)
    run = Run("ray_trainer.py", RAY, agent, "ld-ray", tmp_path)
    try:
        got = settled_diagnoses(agent, [run], [("ld-ray", 0), ("ld-ray", 1)], timeout=300)
        assert set(got) == {("ld-ray", 0), ("ld-ray", 1)}, sorted(got)
        ranks = [r for r in agent.api("/api/v1/ranks")["ranks"] if r["job"] == "ld-ray"]
    finally:
        run.stop()
    # the rank and world size from ray.train.get_context(), one process each
    assert sorted((r["rank"], r["world_size"]) for r in ranks) == [(0, 2), (1, 2)], ranks
    assert len({r["pid"] for r in ranks}) == 2, ranks
    # no collective in this loop: each rank waits on its own shard; a batch pair takes
    # 16 x 30 ms in the one map task against 50 ms of compute, so ~90 % of a step waits
    # (less what Ray's prefetch overlaps; a loaded machine only slows the map)
    for body in got.values():
        print("ray rank %d: %s, data-wait %.1f%%" % (body["rank"], body["verdict"],
                                                    100 * body["data_wait_ratio"]))
        assert body["verdict"] == "input_bound", json.dumps(body)
        assert body["data_wait_ratio"] > 0.5, body["data_wait_ratio"]
        assert body["loader"] is None, body["loader"]  # nothing introspected beyond the wait
