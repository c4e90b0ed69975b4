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
def test_torchdata_nodes_mapper_threads_are_sized_as_workers(agent_factory, tmp_path):
    pytest.importorskip("torchdata.nodes")
    body, entry, run = _run(agent_factory, tmp_path, "nodes")
    try:
        # the ParallelMapper's threads report one batch per Batcher's worth of items they
        # mapped (hook/loaders.py): sized as workers, and named too_few_workers
        assert_starved(body, STARVED)
        assert entry["loader"]["batch_size"] == STARVED["batch"], entry["loader"]
        assert entry["worker_pids"] == [], entry  # threads of the rank's own process
        load = entry["sizing"]["batch_load_seconds"]
        injected = STARVED["batch"] * STARVED["sample_s"]
        assert injected <= load < 3 * injected, entry["sizing"]
        # 8 x 60 ms a batch per thread against 150 ms of compute: 4 threads keep up
        assert entry["sizing"]["workers_to_keep_up"] >= 4, entry["sizing"]
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


@pytest.mark.frameworks
def test_nodes_mapper_threads_report_one_batch_per_batchers_worth_of_items():
    tn = pytest.importorskip("torchdata.nodes")
    import time

    from stallscope.hook import channel, loaders

    def slow(i):
        time.sleep(0.01)
        if i < 0:
            raise ValueError("sample %d" % i)  # the user's error, unchanged, never counted
        return i

    def graph(source_items, **mapper):
        return tn.Loader(tn.Batcher(tn.ParallelMapper(tn.IterableWrapper(source_items), slow, **mapper),
                                    batch_size=4))

    ch = channel.get()
    before = set(ch.streams)
    threads = graph(range(40), num_workers=2, method="thread")
    loaders.time_mappers(threads)
    loaders.time_mappers(threads)  # once: the map is not timed twice
    with ch.flush_lock:  # the flush thread leaves the streams' times where they are
        assert [b[0] for b in threads] == list(range(0, 40, 4))  # same items, same order
        streams = [s for s in ch.streams if s not in before]
        pairs = [p for s in streams for p in zip(s.buf[0::2], s.buf[1::2])]
    assert 1 <= len(streams) <= 2 and all(s.role == "worker" for s in streams), streams
    # 40 items, 4 a batch: 10 batches between the threads, each 4 x 10 ms of sleep
    assert len(pairs) == 10, pairs
    assert all(40e6 <= end - start < 40e6 * 3 for start, end in pairs), pairs
    failing = graph([1, 2, -13, 3], num_workers=0)
    loaders.time_mappers(failing)
    with pytest.raises(ValueError, match="sample -13"):
        list(failing)
    # a process mapper's function is pickled to its processes: left as it is
    procs = graph(range(8), num_workers=1, method="process")
    loaders.time_mappers(procs)
    assert not loaders._timed(procs) and loaders._timed(threads)
