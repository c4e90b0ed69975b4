"""procfs.read_text: whole files, in parts where the kernel hands them over in parts, and
with buffers the agent's allocator serves from its heap."""
import subprocess
import sys

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
