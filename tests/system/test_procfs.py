"""procfs.read_text: whole files, in parts where the kernel hands them over in parts, and
with buffers the agent's allocator serves from its heap. procfs.KeptFiles: a file of many
processes kept open, re-read for current values, bound to the process it was opened on."""
import os
import subprocess
import sys
import time

from stallscope.agent import malloc
from stallscope.system import procfs

# A child with many mappings that cannot merge (alternating protections): its maps file
# is several read chunks long, a seq file the kernel hands over a buffer at a time.
MAPPINGS = r"""
import mmap, sys
maps = [mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 else 0))
        for i in range(int(sys.argv[1]))]
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_file_longer_than_a_read_is_read_whole_and_bad_bytes_are_replaced(tmp_path):
    body = (b"0123456789abcdef" * (procfs.READ_CHUNK // 16)) * 3 + b"tail \xff\xfe end"
    path = tmp_path / "long"
    path.write_bytes(body)
    text = procfs.read_text(str(path))
    assert len(body) > 3 * procfs.READ_CHUNK
    assert text == body.decode("utf-8", "replace")
    assert text.endswith("tail \ufffd\ufffd end")


def test_a_seq_file_handed_over_in_parts_is_read_whole():
    child = subprocess.Popen([sys.executable, "-c", MAPPINGS, "1500"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        path = "/proc/%d/maps" % child.pid
        with open(path) as f:
            expected = f.read()
        text = procfs.read_text(path)
        assert len(expected) > 3 * procfs.READ_CHUNK  # more than one read's worth
        assert text == expected
    finally:
        child.stdin.close()
        child.wait(10)


def test_a_gone_file_is_none():
    assert procfs.read_text("/proc/%d/no-such-file" % 2**22) is None


def test_a_read_buffer_comes_from_the_heap_under_the_agents_allocator():
    # os.read(fd, n) allocates n bytes (and a bytes object's header) before the kernel
    # fills any: at or over the agent's fixed mmap threshold each read of a small /proc
    # file was an mmap, page faults, an mremap and an munmap (strace of the agent at
    # 8 ranks x 8 workers, 20 s: 1002 mmap and munmap and 497 mremap calls; 1 of each
    # with the read under the threshold).
    header = sys.getsizeof(b"")
    assert procfs.READ_CHUNK + header < malloc.MMAP_THRESHOLD


SPIN = "import sys\nprint('ready', flush=True)\nwhile True:\n    sum(range(10000))\n"


def _open_fds():
    return set(os.listdir("/proc/self/fd"))


def test_a_kept_file_gives_the_current_values_at_each_read():
    """The kernel's own record moves between two reads of one kept descriptor: a spinning
    child's schedstat (CPU ns, field 1) grows, as the same file opened afresh says."""
    child = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    files = procfs.KeptFiles("/proc", "schedstat")
    try:
        assert child.stdout.readline().strip() == "ready"
        first = int(files.read(child.pid).split()[0])
        fd = files.fds[child.pid]
        time.sleep(0.3)
        second = int(files.read(child.pid).split()[0])
        fresh = int(procfs.read_text("/proc/%d/schedstat" % child.pid).split()[0])
        assert files.fds[child.pid] == fd  # the same descriptor, not opened again
        assert second - first > 0.1e9 / 2  # ~0.3 s of a core's time, on a busy 2-core machine
        assert first < second <= fresh
        stat = procfs.split_stat(procfs.KeptFiles("/proc", "stat").read(child.pid))
        assert stat[0] in ("R", "S") and int(stat[1]) == os.getpid()  # state, ppid
    finally:
        child.kill()
        child.wait()
        files.close()


def test_a_kept_file_of_a_process_gone_reads_as_gone_and_is_closed():
    """Reaped, the process's kept file fails its read (ESRCH: the descriptor holds that
    process, not its PID), reads as None, and its descriptor is closed; one the owner no
    longer reads is closed by keep()."""
    before = _open_fds()
    files = procfs.KeptFiles("/proc", "stat")
    gone = subprocess.Popen(["sleep", "30"])
    alive = subprocess.Popen(["sleep", "30"])
    try:
        assert files.read(gone.pid) and files.read(alive.pid)
        fd = files.fds[gone.pid]
        assert len(_open_fds() - before) == 2
        gone.kill()
        gone.wait()
        try:
            os.pread(fd, 4096, 0)
            raise AssertionError("a reaped process's stat read without error")
        except ProcessLookupError:  # the kernel's answer: no such process
            pass
        assert files.read(gone.pid) is None
        assert gone.pid not in files.fds
        files.keep([])
        assert files.fds == {} and _open_fds() == before
        assert files.read(alive.pid).split()[0] == str(alive.pid)
    finally:
        alive.kill()
        alive.wait()
        files.close()
    assert _open_fds() == before


def test_a_kept_file_longer_than_its_part_is_read_whole_and_not_kept(tmp_path):
    (tmp_path / "7").mkdir()
    body = "x" * (3 * procfs.KeptFiles.SIZE) + " end"
    (tmp_path / "7" / "big").write_text(body)
    files = procfs.KeptFiles(str(tmp_path), "big")
    assert files.read(7) == body
    assert files.fds == {}
    assert files.read(8) is None  # no such process


def test_past_its_cap_a_file_is_read_and_closed_not_kept(monkeypatch):
    monkeypatch.setattr(procfs.KeptFiles, "MAX_KEPT", 1)
    before = _open_fds()
    files = procfs.KeptFiles("/proc", "stat")
    a, b = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    try:
        assert files.read(a.pid).split()[0] == str(a.pid)
        assert files.read(b.pid).split()[0] == str(b.pid)  # read all the same
        assert list(files.fds) == [a.pid] and len(_open_fds() - before) == 1
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        files.close()
