"""Step phases as the integrations time them (hook/phases.py): each phase its own time,
a phase asked to follow another only after it, nothing before the first step."""
import time

from stallscope.hook.phases import StepPhases


def test_phases_sum_what_each_took_and_count_steps():
    p = StepPhases()
    assert p.snapshot() is None
    for _ in range(3):
        p.begin("forward")
        time.sleep(0.01)
        p.begin("backward", after="forward")
        time.sleep(0.03)
        p.begin("backward", after="forward")  # a second forward hook (evaluation): ignored
        p.begin("optimizer", after="backward")
        p.end_step()
    snap = p.snapshot()
    assert snap["steps"] == 3
    assert 0.03e9 <= snap["forward_ns"] < 0.03e9 + 0.03e9, snap
    assert 0.09e9 <= snap["backward_ns"] < 0.09e9 + 0.03e9, snap
    assert 0 <= snap["optimizer_ns"] < 0.01e9, snap


def test_an_unknown_phase_or_a_step_never_begun_does_not_raise():
    p = StepPhases()
    p.begin("dance")
    p.end_step()
    assert p.snapshot() is None
