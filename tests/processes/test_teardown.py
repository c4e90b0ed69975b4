"""Teardown: undo actions run in reverse on every exit path; signals interrupt the run
but not the undo. Children: process groups are stopped whole, and children die with the
process that started them."""
import os
import signal
import subprocess
import sys
import time

import pytest

from stallscope.processes import children, teardown
from tests.helpers import ROOT


def test_unwinds_in_reverse_on_success_and_on_error():
    done = []
    with teardown.Teardown() as td:
        td.push("a", done.append, "a")
        td.push("b", done.append, "b")
    assert done == ["b", "a"]
    done.clear()
    with pytest.raises(ZeroDivisionError):
        with teardown.Teardown() as td:
            td.push("a", done.append, "a")
            raise ZeroDivisionError
    assert done == ["a"]


def test_a_failing_undo_does_not_stop_the_others(capsys):
    done = []
    with teardown.Teardown() as td:
        td.push("a", done.append, "a")
        td.push("boom", lambda: 1 / 0)
        td.push("c", done.append, "c")
    assert done == ["c", "a"]
    assert "cleanup: boom" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_interrupts_the_run_and_the_undo_still_completes(sig):
    done = []
    old = signal.getsignal(sig)

    def slow_undo():
        os.kill(os.getpid(), sig)  # a second signal while unwinding: noted, not raised
        time.sleep(0.05)
        done.append("slow")

    with pytest.raises(teardown.Interrupted) as e:
        with teardown.Teardown() as td:
            td.push("first", done.append, "first")
            td.push("slow", slow_undo)
            os.kill(os.getpid(), sig)
            time.sleep(5)  # interrupted at once
            done.append("not reached")
    assert done == ["slow", "first"]
    assert e.value.exit_code == 128 + sig
    assert signal.getsignal(sig) is old  # handlers restored


def test_stop_group_ends_the_leader_and_its_children():
    # The leader ignores SIGTERM and has a child in its group: both must go.
    p = children.popen([sys.executable, "-c",
                        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "subprocess.Popen(['sleep', '300']); time.sleep(300)"])
    deadline = time.monotonic() + 10
    while len(children.group_alive(p.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children.group_alive(p.pid)) == 2
    children.stop_group(p, grace=0.5)
    assert children.group_alive(p.pid) == []
    assert p.returncode == -signal.SIGKILL


def test_children_die_with_the_process_that_started_them(tmp_path):
    # PR_SET_PDEATHSIG: a child does not outlive a SIGKILLed parent.
    pidfile = tmp_path / "child.pid"
    code = ("import sys, time; sys.path.insert(0, %r); from stallscope.processes import children; "
            "p = children.popen(['sleep', '300']); open(%r, 'w').write(str(p.pid)); time.sleep(300)"
            % (ROOT, str(pidfile)))
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert children.group_alive(child) == [child]
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while children.group_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children.group_alive(child) == []
