"""Shard reads and cache lookups: the public API, the agent's validation, per-tier
latency from local files against a real FUSE mount with injected latency, and the
WebDataset and fsspec adapters against real shards (each with the real library)."""
import json
import os
import socket
import time

import pytest

import stallscope
from stallscope.agent.parts import shards as agent_shards
from stallscope.hook import adapters, channel, process, shards, tiers
from tests.helpers import wait_until
from tests.helpers.needs import need_fuse


@pytest.fixture
def fresh_hook(monkeypatch):
    """This test process's hook state as a new process would have it."""
    monkeypatch.setattr(tiers, "_seen", [])
    monkeypatch.setattr(tiers, "_mounts", None)
    monkeypatch.setenv("STALLSCOPE_JOB", "shards-test")
    monkeypatch.setenv("RANK", "5")
    old = channel._channel
    if old is not None:
        with old.lock:  # an earlier test's channel must not drain our buffers
            old.sources.clear()
            old.streams.clear()
    monkeypatch.setattr(channel, "_channel", None)
    monkeypatch.setattr(process, "ident", None)
    shards._after_fork()
    yield
    ch = channel._channel
    if ch is not None:
        ch.flush()
        with ch.lock:
            ch.sources.clear()
            ch.streams.clear()
    shards._after_fork()


@pytest.fixture
def hooked(agent, monkeypatch, fresh_hook):
    monkeypatch.setenv("STALLSCOPE_SOCKET", agent.socket)
    return agent


def drain_here():
    """Take what the API recorded, without a channel (the test plays the flush thread)."""
    shards._registered_pid = os.getpid()
    return [payload["io"] for _ident, _role, payload in shards._drain()]


def test_the_api_records_reads_lookups_and_bounds_tiers(fresh_hook):
    shards._registered_pid = os.getpid()
    with stallscope.shard_read("s3://bucket/shard-0001.tar", tier="s3") as r:
        time.sleep(0.01)
        r.bytes = 123

    @stallscope.shard_read(tier="nfs")
    def load(path):
        return b"x" * 10

    assert load("/data/a") == b"x" * 10
    for hit in (True, True, False):
        stallscope.cache_lookup("page", hit)
    for i in range(12):  # 4 more names make 7; the rest fold into "other", the 8th tier
        stallscope.cache_lookup("t%d" % i, True)
    with pytest.raises(OSError):
        with stallscope.shard_read("gone", tier="s3"):
            raise OSError("a failed read is not a latency sample")
    (io,) = drain_here()
    s3 = io["tiers"].index("s3")
    read = next(r for r in io["reads"] if r[3] == s3)
    assert read[1] >= 10_000_000 and read[2] == 123 and len(io["reads"]) == 2
    assert [io["tiers"][r[3]] for r in io["reads"]] == ["s3", "nfs"]
    cache = {io["tiers"][i]: (h, m) for i, h, m in io["cache"]}
    assert cache["page"] == (2, 1) and cache["other"] == (8, 0) and len(io["tiers"]) == 8
    assert [io["tiers"][i] for i, _d, _s in io["slowest"]][0] == "s3"
    assert io["slowest"][0][2] == "s3://bucket/shard-0001.tar"
    assert drain_here() == []  # counts are sent once


def test_storage_requests_are_counted_by_class_and_sent_once(fresh_hook):
    shards._registered_pid = os.getpid()
    for status in (200, 206, 503, 429, 500, 404):
        stallscope.storage_request("s3", status=status, retry=status == 206)
    stallscope.storage_request("s3", timeout=True, retry=True)
    stallscope.storage_request("http", status=200)
    (io,) = drain_here()
    got = {io["tiers"][row[0]]: row[1:] for row in io["requests"]}
    # ok, slow_down, server_error, client_error, timeout, retries
    assert got == {"s3": [2, 2, 1, 1, 1, 2], "http": [1, 0, 0, 0, 0, 0]}, got
    assert io["reads"] == []
    stallscope.storage_request("s3", status=503)
    (io,) = drain_here()  # only what came since
    assert io["requests"] == [[io["tiers"].index("s3"), 0, 1, 0, 0, 0, 0]]
    assert drain_here() == []


def test_urllib3_requests_to_a_throttling_store_are_counted_as_it_answered(fresh_hook, tmp_path):
    """requests (urllib3 underneath) retrying 503s against the lab's object store, which
    answers 503 to every 3rd GET and logs each answer: the adapter's counts by class and
    its retries are the store's own; a request with no answer is a timeout, and the
    client's exception reaches it unchanged."""
    import subprocess
    import sys

    requests = pytest.importorskip("requests")
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    from stallscope.hook.adapters import urllib3pool
    from stallscope.lab import objstore
    from stallscope.processes import servers

    assert [urllib3pool.tier_of(h) for h in ("bucket.s3.us-east-1.amazonaws.com", "storage.googleapis.com",
                                              "acct.blob.core.windows.net", "10.0.0.2", None)] == [
        "s3", "gcs", "azure", "http", "http"]
    (tmp_path / "shard-0000.bin").write_bytes(b"x" * 4096)
    log, port = tmp_path / "served.log", servers.free_port()
    store = subprocess.Popen([sys.executable, "-m", "stallscope.lab.objstore", str(tmp_path), str(port),
                              "--log", str(log), "--error-rate", str(1 / 3)])
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers
    try:
        from stallscope.lab.faults import http_up
        url = "http://127.0.0.1:%d" % port
        wait_until(lambda: http_up(url), timeout=15)
        shards._after_fork()  # the readiness probe's own answers are not the test's
        log.write_text("")
        adapters.enable()
        assert "urllib3" in adapters.enabled
        session = requests.Session()
        session.mount("http://", HTTPAdapter(max_retries=Retry(total=5, status_forcelist=[503],
                                                               backoff_factor=0)))
        for _ in range(12):
            assert session.get(url + "/shard-0000.bin").content == b"x" * 4096
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.get("http://127.0.0.1:%d/x" % silent.getsockname()[1], timeout=0.2)
    finally:
        store.kill()
        store.wait()
        silent.close()
    (io,) = drain_here()
    got = {io["tiers"][row[0]]: row[1:] for row in io["requests"]}
    gets, _ = objstore.served_bytes(str(log))
    statuses = [int(line.split()[1]) for line in log.read_text().splitlines()]
    failed = statuses.count(503)
    # ok, slow_down, server_error, client_error, timeout, retries: every 503 was retried
    assert got == {"http": [gets - failed, failed, 0, 0, 1, failed]}, (got, statuses)
    assert gets == 12 + failed and failed == gets // 3


def test_tiers_follow_mounts_and_schemes(tmp_path):
    assert tiers.of_fstype("fuse.gcsfuse") == tiers.of_fstype("fuse") == "fuse"
    assert tiers.of_fstype("nfs4") == "nfs" and tiers.of_fstype("tmpfs") == "memory"
    assert tiers.of_fstype("ext4") == "local" and tiers.of_fstype("lustre") == "network"
    assert tiers.of_url("https://host/x.tar") == "http" and tiers.of_url("gs://b/x") == "gcs"
    assert tiers.of_url("file://" + str(tmp_path)) == tiers.of_path(tmp_path)
    assert tiers.of_path("/proc/self/status") == "local"  # procfs: not a storage tier we know
    assert tiers.of_path("/dev/shm/x") == "memory"


def send(agent, payload):
    # From the trainer itself (num_workers=0 reads in the main process): a worker may
    # report only for a rank its trainer made.
    msg = {"v": 1, "kind": "report", "role": "main", "pid": os.getpid(),
           "id": {"job": "shards-test", "rank": 9}, "io": payload}
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(agent.socket)
        s.send(json.dumps(msg).encode())


def metric(agent, name, **labels):
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    total = None
    for line in agent.metrics().splitlines():
        head, _, value = line.rpartition(" ")
        if head.startswith(name + "{") and all(('%s="%s"' % kv) in head for kv in labels.items()):
            total = (total or 0) + float(value)
        elif head == name and not want:
            total = float(value)
    return total


def test_the_agent_validates_the_io_part_and_counts_rejects(agent):
    now = time.monotonic_ns()
    good = {"tiers": ["fuse"], "reads": [[now, 5_000_000, 10, 0]], "cache": [[0, 3, 1]],
            "slowest": [[0, 5_000_000, "shard-1"]]}
    send(agent, good)
    send(agent, dict(good, tiers=["Bad Tier"]))
    send(agent, dict(good, reads=[[now, 5, 10, 1]]))         # tier index out of range
    send(agent, dict(good, reads=[[now, -5, 10, 0]]))        # negative duration
    send(agent, dict(good, tiers=["t%d" % i for i in range(9)]))
    send(agent, dict(good, slowest=[[0, 1, "a\nb"]]))        # control character in a shard ID
    send(agent, "not an object")
    send(agent, dict(good, requests=[[0, 1, 2, 3]]))          # a short request row
    send(agent, dict(good, requests=[[0, 1, -2, 0, 0, 0, 0]]))  # a negative count
    send(agent, dict(good, reads=[], cache=[], slowest=[], requests=[[0, 15, 4, 1, 0, 0, 5]]))
    rejected = "stallscope_agent_rejected_io_reports_total"
    wait_until(lambda: metric(agent, rejected) == 8, timeout=10)
    assert metric(agent, rejected, reason="bad_tier") == 1
    assert metric(agent, rejected, reason="too_many_tiers") == 1
    assert metric(agent, rejected, reason="bad_schema") == 6
    # 20 requests: 15 ok, 4 slow_down, 1 server error; 5 retries
    wait_until(lambda: metric(agent, "stallscope_storage_failed_requests_total", tier="fuse") == 5)
    assert metric(agent, "stallscope_storage_requests_total", tier="fuse") == 20
    assert metric(agent, "stallscope_storage_requests_total", tier="fuse", result="slow_down") == 4
    assert metric(agent, "stallscope_storage_retries_total", tier="fuse") == 5
    assert metric(agent, "stallscope_shard_read_seconds_count", tier="fuse") == 1
    assert metric(agent, "stallscope_cache_requests_total", tier="fuse", result="hit") == 3
    assert metric(agent, "stallscope_cache_requests_total", tier="fuse", result="miss") == 1
    (r,) = agent.api("/api/v1/ranks")["ranks"]
    assert r["shard_reads"]["slowest"][0]["shard"] == "shard-1"
    fuse = r["shard_reads"]["tiers"]["fuse"]
    assert (fuse["requests"], fuse["failed_requests"], fuse["retries"]) == (20, 5, 5)
    body = agent.api("/api/v1/timeline?rank=9&seconds=60")
    assert [v for _t, v in body["signals"]["storage_error_ratio"]] == [0.25]


def test_quantiles_are_nearest_rank():
    xs = list(range(1, 101))
    assert agent_shards.quantiles(xs) == [50, 95, 99]
    assert agent_shards.quantiles([7]) == [7, 7, 7] and agent_shards.quantiles([]) is None


class CountingCache:
    """The test's own caching layer in front of a slow tier."""

    def __init__(self, root):
        self.root, self.data, self.hits, self.misses = root, {}, 0, 0

    def get(self, name):
        hit = name in self.data
        stallscope.cache_lookup("lru", hit)
        if hit:
            self.hits += 1
        else:
            self.misses += 1
            self.data[name] = self.root.read(name)
        return self.data[name]


def quantile(agent, tier, q):
    """The pod's sliding-window quantile of one tier, as /api/v1/ranks gives it."""
    ranks = agent.api("/api/v1/ranks")["ranks"]
    tiers_of = ranks[0]["shard_reads"]["tiers"] if ranks and "shard_reads" in ranks[0] else {}
    return tiers_of.get(tier, {}).get("pod_p%s_seconds" % q)


@pytest.fixture
def slow_mount(tmp_path):
    need_fuse()
    from stallscope.lab import slowfs

    # In a mount namespace of its own, so that other agents on the machine leave it alone.
    fs = slowfs.SlowFS(str(tmp_path / "mnt"), latency=0.05, files=12, size=4096, private=True)
    try:
        yield fs.start()
    finally:
        fs.stop()


@pytest.mark.slow
def test_per_tier_p99_reflects_the_injected_latency(hooked, tmp_path, slow_mount):
    latency = 0.05
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    for i in range(12):
        (local_dir / ("file%03d" % i)).write_bytes(b"l" * 4096)
    # The mount lives in the daemon's namespace; its mount table names the tier a
    # trainer in that namespace would get.
    mounts = tiers.read_mounts("/proc/%d/mountinfo" % slow_mount.proc.pid)
    assert tiers.of_fstype(tiers._mount_fstype(slow_mount.mountpoint + "/x", mounts)) == "fuse"
    local = stallscope.DatasetRoot(local_dir)
    remote = stallscope.DatasetRoot(slow_mount.path, tier="fuse")
    local_tier = tiers.of_path(str(local_dir / "file000"))
    assert local_tier != "fuse"
    for i in range(12):
        assert local.read("file%03d" % i) == b"l" * 4096
        with remote.open("file%03d" % i) as f:
            assert f.read() == b"s" * 4096
    cache = CountingCache(remote)
    for name in ["file000", "file001", "file000", "file002", "file001", "file000"]:
        cache.get(name)
    assert (cache.hits, cache.misses) == (3, 3)
    channel.get().flush()
    wait_until(lambda: metric(hooked, "stallscope_shard_read_seconds_count", tier="fuse") == 15
               and quantile(hooked, "fuse", "99") is not None, timeout=15)
    assert metric(hooked, "stallscope_shard_read_seconds_count", tier=local_tier) == 12
    # Every FUSE read waited at least one injected operation (open and read each sleep);
    # a local read of 4 KiB waits for none of them.
    assert latency <= quantile(hooked, "fuse", "50") <= quantile(hooked, "fuse", "99") < 20 * latency
    assert quantile(hooked, local_tier, "99") < latency
    assert metric(hooked, "stallscope_cache_requests_total", tier="lru", result="hit") == 3
    assert metric(hooked, "stallscope_cache_requests_total", tier="lru", result="miss") == 3
    (r,) = hooked.api("/api/v1/ranks")["ranks"]
    assert r["rank"] == 5 and r["shard_reads"]["tiers"]["fuse"]["bytes"] == 15 * 4096
    assert r["shard_reads"]["slowest"][0]["tier"] == "fuse"
    # what each tier served, per pod (issue 31): the bytes the reads returned
    assert metric(hooked, "stallscope_shard_read_bytes_total", tier="fuse") == 15 * 4096
    assert metric(hooked, "stallscope_shard_read_bytes_total", tier=local_tier) == 12 * 4096
    body = hooked.api("/api/v1/timeline?rank=5&seconds=60")
    assert len(body["signals"]["shard_read_seconds"]) == 27
    assert sorted(v for _t, v in body["signals"]["shard_read_bytes"]) == [4096.0] * 27
    assert [v for _t, v in body["signals"]["cache_miss_ratio"]]


@pytest.mark.slow
def test_webdataset_shards_through_a_watched_loader(hooked, tmp_path):
    wds = pytest.importorskip("webdataset")
    import torch

    expected, sizes = {}, []
    for s in range(4):
        path = str(tmp_path / ("shard-%04d.tar" % s))
        with wds.TarWriter(path) as w:
            for k in range(6):
                key = "s%d_%d" % (s, k)
                expected[key] = ("%s payload" % key).encode() * 50
                w.write({"__key__": key, "txt": expected[key]})
        sizes.append(os.path.getsize(path))
    urls = str(tmp_path / "shard-{0000..0003}.tar")
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    loader = stallscope.watch(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    got = {sample["__key__"]: sample["txt"] for sample in loader}
    assert got == expected
    channel.get().flush()  # the trainer's own report (worker PIDs), without waiting a beat
    assert "webdataset" in adapters.enabled
    tier = tiers.of_path(urls)

    def counted():
        return metric(hooked, "stallscope_shard_read_seconds_count", tier=tier) == 4
    wait_until(counted, timeout=15)  # one read per shard, reported by the workers
    (r,) = [x for x in hooked.api("/api/v1/ranks")["ranks"] if x["rank"] == 5]
    nbytes = r["shard_reads"]["tiers"][tier]["bytes"]
    # tarfile stops at the end-of-archive marker, before the last record's padding.
    assert sum(sizes) - 4 * 10240 <= nbytes <= sum(sizes)
    assert len(r["worker_pids"]) == 2
    # With cache_dir, remote shards (pipe: here) are downloaded once: 4 misses, then hits.
    (tmp_path / "wds-cache").mkdir()
    pipes = ["pipe:cat %s" % (tmp_path / ("shard-%04d.tar" % s)) for s in range(4)]
    for _epoch in range(2):
        ds = wds.WebDataset(pipes, shardshuffle=False, empty_check=False,
                            cache_dir=str(tmp_path / "wds-cache"))
        assert {x["__key__"] for x in stallscope.watch(ds)} == set(expected)
    channel.get().flush()
    wait_until(lambda: metric(hooked, "stallscope_cache_requests_total", tier="wds-cache") == 8)
    assert metric(hooked, "stallscope_cache_requests_total", tier="wds-cache", result="miss") == 4
    # one read per shard and epoch: a miss's download is part of its read, not another
    assert metric(hooked, "stallscope_shard_read_seconds_count", tier="pipe") == 8


def test_fsspec_reads_and_simplecache_hits_and_misses(hooked, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    adapters.enable()
    assert "fsspec" in adapters.enabled
    mem = fsspec.filesystem("memory")
    for i in range(3):
        mem.pipe("/stallscope-test/f%d" % i, b"m%d" % i * 100)
    for i in range(3):
        with mem.open("/stallscope-test/f%d" % i, "rb") as f:
            assert f.read() == b"m%d" % i * 100
    cached = fsspec.filesystem("simplecache", target_protocol="memory",
                               cache_storage=str(tmp_path / "cache"))
    for i in [0, 1, 0, 2, 0]:
        with cached.open("/stallscope-test/f%d" % i, "rb") as f:
            assert f.read() == b"m%d" % i * 100
    with fsspec.open("memory://stallscope-test/f1", "rt") as f:  # text mode: one read
        assert f.read() == "m1" * 100
    channel.get().flush()
    wait_until(lambda: metric(hooked, "stallscope_cache_requests_total", tier="simplecache") == 5,
               timeout=10)
    assert metric(hooked, "stallscope_cache_requests_total", tier="simplecache", result="miss") == 3
    assert metric(hooked, "stallscope_cache_requests_total", tier="simplecache", result="hit") == 2
    # The downloads of the 3 misses went through memory's open inside simplecache's:
    # part of those reads, not reads of their own.
    assert metric(hooked, "stallscope_shard_read_seconds_count", tier="memory") == 4
    assert metric(hooked, "stallscope_shard_read_seconds_count", tier="simplecache") == 5
    mem.rm("/stallscope-test", recursive=True)


@pytest.mark.slow
def test_streaming_downloads_are_reads_and_misses_and_a_warm_cache_hits(hooked, tmp_path, monkeypatch):
    # Mosaic Streaming runs in its own venv (make test-composer): mosaicml-streaming
    # imports torchvision, which does not load beside the main venv's CPU torch.
    streaming = pytest.importorskip("streaming", reason="mosaicml-streaming: make test-composer")
    import gc

    monkeypatch.delenv("RANK")  # Streaming would partition the samples for rank 5 of 1

    import torch

    remote = tmp_path / "remote"
    with streaming.MDSWriter(out=str(remote), columns={"x": "int", "payload": "bytes"},
                             size_limit=1024) as w:
        for i in range(60):
            w.write({"x": i, "payload": b"%02d" % i * 20})
    files = sorted(p for p in remote.iterdir() if p.suffix == ".mds")
    assert len(files) >= 3  # the size limit splits the 60 samples
    tier = tiers.of_path(remote)

    def epoch():
        ds = streaming.StreamingDataset(remote=str(remote), local=str(tmp_path / "cache"),
                                        batch_size=4, shuffle=False)
        loader = stallscope.watch(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2), rank=5)
        got = sorted(int(x) for batch in loader for x in batch["x"])
        assert got == list(range(60))  # the samples as written, through the patches
        channel.get().flush()
        del loader, ds
        gc.collect()  # streaming frees the local dir's shared memory with its dataset

    def lookups(result):
        return metric(hooked, "stallscope_cache_requests_total", tier="streaming-cache", result=result) or 0

    epoch()  # cold: the workers copy each shard from the remote into the cache once
    assert "streaming" in adapters.enabled
    wait_until(lambda: metric(hooked, "stallscope_shard_read_seconds_count", tier=tier) == len(files),
               timeout=15)
    wait_until(lambda: lookups("miss") == len(files), timeout=10)
    (r,) = [x for x in hooked.api("/api/v1/ranks")["ranks"] if x["rank"] == 5]
    assert r["shard_reads"]["tiers"][tier]["bytes"] == sum(p.stat().st_size for p in files)
    cold_hits = lookups("hit")  # a worker finding a shard the other one had copied
    assert cold_hits <= len(files)

    epoch()  # warm: every shard is in the cache; nothing is read from the remote again
    # each worker needs each shard at most once (its batches, in order, without shuffle)
    wait_until(lambda: lookups("hit") - cold_hits >= len(files), timeout=10)
    time.sleep(1.5)  # a late report would show here
    assert lookups("hit") - cold_hits <= 2 * len(files)
    assert lookups("miss") == len(files)
    assert metric(hooked, "stallscope_shard_read_seconds_count", tier=tier) == len(files)
