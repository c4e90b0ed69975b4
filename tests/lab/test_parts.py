"""The lab's parts on their own: shard sources, the object store, what a scenario needs,
and the per-rank mount namespace."""
import os
import subprocess
import sys
import time

import pytest

from stallscope.lab import faults, needs, pods, sources
from stallscope.processes import children, servers, teardown
from tests.helpers.needs import need_fuse, need_root


@pytest.fixture
def store(tmp_path):
    """A real object store over 4 shards, bandwidth capped at 20 MB/s."""
    sources.make_shards(str(tmp_path / "shards"), 4, 1 << 20)
    port = servers.free_port()
    p = children.popen([sys.executable, "-m", "stallscope.lab.objstore", str(tmp_path / "shards"),
                        str(port), "--bandwidth", "20"], env=children.child_env())
    url = "http://127.0.0.1:%d" % port
    try:
        assert teardown.wait_for(lambda: faults.http_up(url), 20)
        yield url, tmp_path / "shards"
    finally:
        children.stop_group(p)


def test_make_shards_is_idempotent(tmp_path):
    d = str(tmp_path / "s")
    sources.make_shards(d, 3, 10000)
    first = {n: os.stat(os.path.join(d, n)).st_mtime_ns for n in os.listdir(d)}
    sources.make_shards(d, 3, 10000)
    assert sorted(first) == ["shard-0000.bin", "shard-0001.bin", "shard-0002.bin"]
    assert {n: os.stat(os.path.join(d, n)).st_mtime_ns for n in os.listdir(d)} == first
    assert all(os.path.getsize(os.path.join(d, n)) == 10000 for n in first)


@pytest.mark.parametrize("direct", [False, True])
def test_file_source_reads_the_asked_bytes(tmp_path, direct):
    d = sources.make_shards(str(tmp_path / "s"), 2, 1 << 20)
    src = sources.FileSource(d, 2, 65536, 1 << 20, direct=direct)
    reads = [src.read(i) for i in range(6)]
    assert all(len(r) == 65536 for r in reads)
    with open(os.path.join(d, "shard-0001.bin"), "rb") as f:
        whole = f.read()
    assert reads[1] in whole


def test_file_source_retries_then_skips_a_failing_read(tmp_path, capsys):
    src = sources.FileSource(str(tmp_path / "gone"), 2, 4096, 1 << 20, retries=2, retry_s=0.01)
    assert src.read(0) == b""
    assert src.errors == 3
    assert "No such file" in capsys.readouterr().out


def test_object_store_serves_ranges_and_caps_bandwidth(store):
    url, shards = store
    src = sources.CachedSource(None, url, 4, 1 << 20)
    t0 = time.monotonic()
    data = src.read(2)
    took = time.monotonic() - t0
    with open(shards / "shard-0002.bin", "rb") as f:
        assert data == f.read()
    assert took >= (1 << 20) / 20e6 * 0.95  # 1 MiB at 20 MB/s: a lower bound, load-proof


def test_cold_cache_misses_and_a_warm_one_hits(store, tmp_path):
    url, shards = store
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "shard-0000.bin").write_bytes((shards / "shard-0000.bin").read_bytes())
    cached = sources.CachedSource(str(warm), url, 4, 4096)
    lookups = []
    orig = sources._cache_lookup
    sources._cache_lookup = lambda tier, hit: lookups.append((tier, hit))
    try:
        assert cached.read(0) == (shards / "shard-0000.bin").read_bytes()[:4096]
        assert cached.read(1) == (shards / "shard-0001.bin").read_bytes()[:4096]
    finally:
        sources._cache_lookup = orig
    assert lookups == [("local-cache", True), ("local-cache", False)]
    assert sorted(os.listdir(warm)) == ["shard-0000.bin"]  # fill=False: stays cold


def test_a_cache_in_front_of_a_directory_reads_misses_from_it(tmp_path):
    """LocalCache's source: hits from the cache directory, misses from the slow tier's
    directory (a FUSE mount in the mixin's live test) under its own file names."""
    slow = tmp_path / "slow"
    slow.mkdir()
    for i in range(3):
        (slow / ("file%03d" % i)).write_bytes(bytes([i]) * 8192)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "shard-0000.bin").write_bytes(b"c" * 8192)
    src = sources.CachedSource(str(cache), None, 3, 4096, remote_dir=str(slow), remote_pattern="file%03d")
    lookups = []
    orig = sources._cache_lookup
    sources._cache_lookup = lambda tier, hit: lookups.append(hit)
    try:
        assert [src.read(i) for i in range(3)] == [b"c" * 4096, b"\x01" * 4096, b"\x02" * 4096]
    finally:
        sources._cache_lookup = orig
    assert lookups == [True, False, False]
    assert sorted(os.listdir(cache)) == ["shard-0000.bin"]


def test_combined_faults_prepare_in_order_and_merge_what_they_add_to_the_pod():
    calls = []

    class Part(faults.Fault):
        def __init__(self, name, missing=None):
            self.name, self.reason, self.summary = name, missing, name

        def missing(self):
            return self.reason

        def prepare(self, run):
            calls.append(self.name)

        def setup_lines(self):
            return ["echo " + self.name]

        def own_mounts(self):
            return ("/mnt/" + self.name,)

    both = faults.Combined(Part("a"), Part("b"))
    both.prepare(None)
    assert calls == ["a", "b"] and both.summary == "a; b" and both.missing() is None
    assert both.setup_lines() == ["echo a", "echo b"] and both.own_mounts() == ("/mnt/a", "/mnt/b")
    ready, left_out = faults.available(Part("ok"), Part("no", missing="needs x"))
    assert [p.name for p in ready] == ["ok"] and list(left_out.values()) == ["needs x"]
    assert faults.Combined(Part("x", missing="needs x")).missing() == "needs x"


def test_checkpoint_upload_lands_on_disk_and_only_the_newest_set_is_kept(store):
    url, shards = store
    block = os.urandom(1 << 20)
    for seq in range(2):
        for part in range(2):
            assert objstore_upload(url, "ckpt-%05d.part%d" % (seq, part), 300000, block) == 201
    assert sorted(os.listdir(shards / "checkpoints")) == ["ckpt-00001.part0", "ckpt-00001.part1"]
    assert os.path.getsize(shards / "checkpoints" / "ckpt-00001.part1") == 300000


def objstore_upload(url, name, n, block):
    from stallscope.lab import checkpointer

    return checkpointer.upload(url, name, n, block)


def test_needs_explain_what_is_missing_in_one_line():
    for name in needs.CHECKS:
        reason = needs.check(name)
        assert reason is None or ("\n" not in reason and len(reason) < 160)
    assert (needs.check("disk") is None) == (needs.disk_dir() is not None)
    if os.geteuid() == 0:
        assert needs.check("root") is None


def test_a_scenario_needing_root_exits_2_with_one_line_as_another_user():
    need_root()
    from tests.helpers.needs import as_nobody
    r = subprocess.run(as_nobody([sys.executable, "-m", "stallscope", "lab", "run", "cpu-throttle"]),
                       capture_output=True, text=True, env=children.child_env(), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "stallscope lab: cpu-throttle needs root (run it with sudo)"


def test_pod_namespace_detaches_foreign_fuse_mounts_but_keeps_its_own(tmp_path):
    need_fuse()
    from stallscope.lab.slowfs import SlowFS

    with SlowFS(str(tmp_path / "foreign")) as foreign:
        cmd = pods.wrap(["cat", "/proc/self/mountinfo"])
        seen = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        assert foreign.mountpoint not in seen
        with open("/proc/self/mountinfo") as f:
            assert foreign.mountpoint in f.read()  # the host's namespace is untouched

        class Keep(faults.Fault):
            def own_mounts(self):
                return (foreign.mountpoint,)
        seen = subprocess.run(pods.wrap(["cat", "/proc/self/mountinfo"], Keep()),
                              capture_output=True, text=True, check=True).stdout
        assert foreign.mountpoint in seen


def test_tiny_shm_lives_only_in_the_ranks_namespace():
    need_root()
    cmd = pods.wrap([sys.executable, "-c",
                                   "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize, "
                                   "(s.f_blocks - s.f_bavail) * s.f_frsize)"], faults.TinyShm())
    size, used = map(int, subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split())
    assert size == 16 << 20 and used >= 14 << 20
    assert os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize != 16 << 20
    assert not os.path.exists("/dev/shm/torch_leftover_of_crashed_run")


def test_a_pod_has_its_own_cgroup_which_goes_with_the_teardown(tmp_path):
    need_root()
    if pods.v2_root() is None:
        pytest.skip("needs a cgroup v2 hierarchy")

    class Run:  # what pods.make_cgroup uses of a lab Job
        job = "lab-test"
        made = []

        def created(self, kind, value):
            self.made.append(value)

    run = Run()
    with teardown.Teardown() as run.td:
        cg = pods.make_cgroup(run, 3)
        out = subprocess.run(pods.wrap(["cat", "/proc/self/cgroup"], cgroup=cg), capture_output=True,
                             text=True, check=True).stdout
        v2 = [line for line in out.splitlines() if line.startswith("0::")][0]
        assert cg.endswith(v2[3:]) and "rank3" in v2, (cg, v2)
        assert os.path.exists(os.path.join(cg, "io.pressure"))
    assert run.made == [cg] and not os.path.exists(cg)


def _next_times(loader, n=8):
    """Seconds each next() takes once the workers are far ahead (their queue full)."""
    it = iter(loader)
    next(it)
    time.sleep(1.0)  # one worker, prefetch 4: four batches ready and waiting, in order
    out = []
    for _ in range(min(n, 4)):
        t = time.perf_counter()
        batch = next(it)
        out.append(time.perf_counter() - t)
    del it
    return sorted(out), batch


def test_a_batch_record_costs_its_unpickling_in_the_training_process():
    # victims-over-line's victims (trainer key batch_unpickle_s): the cost is paid inside
    # next() in the training process, on batches the workers made long before: a
    # transfer cost, not the workers'.
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, default_collate

    from stallscope.lab.handover import with_cost

    data = [torch.zeros(4) for _ in range(64)]
    # One worker: its batches arrive in order, so each next() unpickles exactly its own (with
    # two, a batch that arrives early is unpickled by the call that waits for the one before).
    kw = dict(batch_size=4, num_workers=1, multiprocessing_context="fork", prefetch_factor=4)
    plain, _ = _next_times(DataLoader(data, collate_fn=default_collate, **kw))
    costly, batch = _next_times(DataLoader(data, collate_fn=with_cost(default_collate, 0.08), **kw))
    assert batch[1] == 0.08 and tuple(batch[0].shape) == (4, 4)  # the record, unpickled
    # every ready batch waited its 80 ms; without the record the median ready batch takes
    # a fraction of that even on a loaded machine
    assert costly[0] >= 0.08, costly
    assert plain[len(plain) // 2] < 0.08 / 2, plain
