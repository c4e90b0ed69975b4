"""pagefaults: the major page faults of a rank's loader, from the kernel's own count, for
real worker processes that read a cold file through a memory map (and one that is
replaced by a new generation), against the faults each counted itself."""
import os
import subprocess
import time

from stallscope.exporters import pagefaults
from tests.helpers.exporters import collect, context, kill, spawn, table_with, values

PAGES = 512

# A worker: waits for "go", maps the file and touches one byte of every page (the file
# cold: each touch of a page not yet read is a major fault, or is served by the
# readahead of one), prints its own majflt before and after, then sleeps.
TOUCH = ("import mmap, os, sys\n"
         "def majflt():\n"
         "    with open('/proc/self/stat') as f:\n"
         "        return int(f.read().rpartition(')')[2].split()[9])\n"
         "sys.stdin.readline()\n"
         "before = majflt()\n"
         "with open(%r, 'rb') as f:\n"
         "    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
         "    m.madvise(mmap.MADV_RANDOM)  # no readahead: a fault a page\n"
         "    total = sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))\n"
         "print(before, majflt(), flush=True)\n"
         "import time; time.sleep(60)\n")


def cold_file(path):
    with open(path, "wb") as f:
        f.write(os.urandom(PAGES * os.sysconf("SC_PAGE_SIZE")))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def touch(proc):
    proc.stdin.write("go\n")
    proc.stdin.flush()
    before, after = map(int, proc.stdout.readline().split())
    return after - before


def test_stat_text_parsed_or_refused():
    text = "4243 (pt_data_worker) D 4242 4242 4242 0 -1 4194624 182736 0 12 0 1250 250 0 0 20 0 1 0 " \
           "1240000 4294967296 65536\n"
    assert pagefaults.major_faults(text) == (1240000, 12.0)
    for bad in (None, "", "1 (x) S 1 2", "1 (x) S 1 1 1 0 -1 0 0 0 x 0 0 0 0 0 0 0 1 0 5 0 0"):
        assert pagefaults.major_faults(bad) is None, bad


def test_the_faults_of_real_workers_reading_a_mapped_cold_file(tmp_path):
    procs = []
    try:
        paths = [str(tmp_path / ("data%d.bin" % i)) for i in range(2)]
        for p in paths:
            cold_file(p)  # tmp_path: this machine's disk (a tmpfs page would never fault)
        main = subprocess.Popen(["sleep", "60"])
        procs.append(main)
        gen1 = spawn(TOUCH % paths[0], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(gen1)
        table = table_with(dict(pid=main.pid, worker_pids=[gen1.pid]))
        rank = table.snapshot()[0]
        ctx = context(table)
        exp = pagefaults.PageFaultsExporter(ctx)
        collect(exp, [rank])  # the first reading: what gen1 did before is not counted
        first = touch(gen1)
        time.sleep(0.05)
        fams = collect(exp, [rank])
        assert first >= PAGES // 2, first  # the file was cold: most pages faulted in
        # the kernel's count over the two readings: the touches, and at most a few pages
        # of the interpreter's own faulted in around them
        [counted] = values(fams, "stallscope_loader_major_faults_total")
        assert first <= counted <= first + 16, (first, counted)
        [(_, rate)] = ctx.samples.series(rank.key, "loader_major_faults_rate")
        assert rate > 0
        # the epoch ends: gen1 goes, gen2 starts and faults its own file in; all of it
        # counts, from its first fault
        kill(gen1)
        gen2 = spawn(TOUCH % paths[1], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(gen2)
        with table.lock:
            rank.worker_pids = [gen2.pid]
        second = touch(gen2)
        with open("/proc/%d/stat" % gen2.pid) as f:
            own = pagefaults.major_faults(f.read())[1]  # every fault of gen2's life
        fams = collect(exp, [rank])
        assert second >= PAGES // 2 and own >= second
        assert values(fams, "stallscope_loader_major_faults_total") == [counted + own]
    finally:
        for p in procs:
            kill(p)


def test_a_rank_without_readable_workers_records_nothing():
    table = table_with(dict(pid=2 ** 22 + 1, worker_pids=[2 ** 22 + 2]))
    ctx = context(table)
    exp = pagefaults.PageFaultsExporter(ctx)
    rank = table.snapshot()[0]
    collect(exp, [rank])
    fams = collect(exp, [rank])
    assert values(fams, "stallscope_loader_major_faults_total") == [0]
    assert ctx.samples.series(rank.key, "loader_major_faults_rate") == []
