"""loaderio: the bytes a rank's loader reads, from the kernel's own I/O accounting of
real DataLoader workers reading a real file (/proc/<pid>/io), against the bytes the
dataset read."""
import os
import time

import pytest

from stallscope.exporters import loaderio
from stallscope.report import LoaderSettings
from tests.helpers.exporters import collect, context, samples_of, table_with

CHUNK = 256 << 10
SAMPLES = 48


def test_io_text_parsed_or_refused():
    text = "rchar: 4242000\nwchar: 4096\nsyscr: 120\nsyscw: 3\nread_bytes: 2171904\n" \
           "write_bytes: 0\ncancelled_write_bytes: 0\n"
    assert loaderio.parse_io(text) == (4242000, 2171904)
    # a truncated, garbled or negative reading is no reading
    for bad in (None, "", "rchar: 5\n", "rchar: x\nread_bytes: 1\n", "rchar: -1\nread_bytes: 1\n"):
        assert loaderio.parse_io(bad) is None, bad


def _read_bytes(pid):
    with open("/proc/%d/io" % pid) as f:
        return loaderio.parse_io(f.read())[1]


class _FileChunks:
    """Sample i: the i-th CHUNK of a file, read with plain open()/read()."""

    def __init__(self, path, start):
        self.path, self.start = path, start

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        self.start.wait(30)  # the exporter's first reading comes before any sample's
        time.sleep(0.02)
        with open(self.path, "rb") as f:
            f.seek(i * CHUNK)
            return len(f.read(CHUNK))


def test_the_bytes_real_workers_read_from_a_file(tmp_path):
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "data.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(CHUNK * SAMPLES))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold: every byte from the device
    os.close(fd)
    import multiprocessing

    start = multiprocessing.get_context("fork").Event()
    loader = torch.utils.data.DataLoader(_FileChunks(path, start), batch_size=4, num_workers=2,
                                         persistent_workers=True, multiprocessing_context="fork")
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    table = table_with(dict(pid=os.getpid(), worker_pids=pids))
    ctx = context(table)
    exp = loaderio.LoaderIoExporter(ctx)
    assert exp.unavailable() is None
    rank = table.snapshot()[0]
    collect(exp, [rank])
    before = [_read_bytes(pid) for pid in pids]  # the workers wait on ``start``: still
    start.set()
    read = batches = 0
    for batch in it:
        read += sum(batch.tolist())
        batches += 1
        rank.wait.observe_ns(1000)  # as the rank's reports count its batches (agent/parts/ranks.py)
    rank.loader = LoaderSettings(batch_size=4)
    time.sleep(0.1)
    got = samples_of(collect(exp, [rank]))
    after = [_read_bytes(pid) for pid in pids]  # idle now: the loader is exhausted
    del it, loader
    total = {dict(k[1])["io"]: v for k, v in got.items() if k[0] == "stallscope_loader_read_bytes_total"}
    assert read == CHUNK * SAMPLES
    print("read %d, exported %s" % (read, total))
    # every byte the dataset read, and little else (the index queue's pickles)
    assert abs(total["all"] - read) <= 0.05 * read, (total, read)
    # the block bytes are the kernel's own count for these workers, and the file was
    # cold: every byte of it came from the device (tmp_path is on this machine's ext4
    # disk; tmpfs would report none). The count may be larger, never smaller: it also
    # holds the pages of code a worker ran for the first time (CI, a fresh venv after
    # minutes of other tests: 1.8 MB over a 12.6 MB file), which no rchar shows.
    assert total["block"] == sum(after) - sum(before), (total, before, after)
    assert total["block"] >= 0.95 * read, total
    fields = exp.rank_fields(rank)["loader_io"]
    # 12 batches of 4 samples of CHUNK bytes
    assert batches == SAMPLES // 4
    assert abs(fields["read_bytes_per_batch"] - 4 * CHUNK) <= 0.05 * 4 * CHUNK, fields
    assert abs(fields["read_bytes_per_sample"] - CHUNK) <= 0.05 * CHUNK, fields
    assert fields["samples_per_second"] == pytest.approx(4 * fields["batches_per_second"])
    assert fields["read_bytes_total"] == total["all"]  # the pod's one rank
    [(_, rate)] = ctx.samples.series(rank.key, "loader_read_bytes_rate")
    assert rate == pytest.approx(total["all"] / fields["interval_seconds"])
    # over the loader's life since the first reading: the bytes read, per batch it fed
    [(_, life)] = ctx.samples.series(rank.key, "loader_life_read_bytes_per_batch")
    assert life == pytest.approx(total["all"] / batches)
    assert abs(life - 4 * CHUNK) <= 0.05 * 4 * CHUNK, life
