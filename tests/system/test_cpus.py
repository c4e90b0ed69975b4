"""CPU lists as the kernel writes them, and a real process's allowed CPUs."""
import os

from stallscope.system import cpus


def test_cpulists_parse_as_the_kernel_writes_them():
    assert cpus.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpus.parse_cpulist("") == frozenset()
    for bad in ("3-1", "a", "0-99999999", "1,,x"):
        assert cpus.parse_cpulist(bad) == frozenset()


def test_allowed_cpus_of_this_process_are_its_affinity():
    assert cpus.allowed_cpus("/proc", os.getpid()) == frozenset(os.sched_getaffinity(0))
    assert cpus.allowed_cpus("/proc", os.getpid(), os.getpid()) == frozenset(os.sched_getaffinity(0))
    assert cpus.allowed_cpus("/proc", 2 ** 22 + 1) == frozenset()  # no such process
