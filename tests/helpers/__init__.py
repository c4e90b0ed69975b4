"""Everything the tests share, in one place: test modules (tests/<area>/test_*.py) import
from here and never from one another, and conftest.py holds only pytest fixtures.

- needs.py       skip rules: root, /dev/fuse, a writable cpu cgroup, prometheus; as_nobody
- agent.py       talking to a real agent process: raw socket messages, /metrics lookups
- exporters.py   a real rank table and host for the exporter tests, collected families
- correlate.py   batch events, rank traces and reports for the correlator's tests
- gpu.py         the dcgm-exporter fixtures (tests/data/dcgm) and a server for them
- fake_nvml.py   a fake pynvml (also used by benchmarks/bench_gpu.py)
- golden.py      the golden run (tests/golden and tests/vocabulary/test_emitted.py)
- lab.py         running the lab as a command or a session, and what a run left behind
- k8s.py         rendering the kustomizations for tests/deploy
- trainers/      training loops the tests run as subprocesses, by path
"""
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINERS = os.path.join(ROOT, "tests", "helpers", "trainers")


def wait_until(pred, timeout=10.0, step=0.05):
    """``pred()``'s first truthy value, polled every ``step`` s; AssertionError after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError("condition not met in %.1fs" % timeout)
