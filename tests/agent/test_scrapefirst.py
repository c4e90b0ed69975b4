"""The correlator's loops wait for a /metrics render in progress (agent/web/scrapefirst.py),
never for long, and never so often that back-to-back scrapes stop the analysis."""
import threading
import time

from stallscope.agent.web.scrapefirst import ScrapeFirst


def _wait_for(cond):
    end = time.monotonic() + 30
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    assert cond()


def test_pause_is_free_when_nothing_renders():
    gate = ScrapeFirst(wait_s=30)
    gate.pause()
    assert gate.waits == 0


def test_pause_waits_for_the_render_in_progress():
    gate = ScrapeFirst(wait_s=30, run_s=0)
    order, entered, release = [], threading.Event(), threading.Event()

    def render():
        with gate.serving():
            entered.set()
            release.wait(30)
            order.append("render done")

    def work():
        gate.pause()
        order.append("work")

    r = threading.Thread(target=render)
    r.start()
    entered.wait(30)
    w = threading.Thread(target=work)
    w.start()
    _wait_for(lambda: gate.waits == 1)
    time.sleep(0.1)
    assert order == []  # the work is held while the render runs
    release.set()
    r.join(30)
    w.join(30)
    assert order == ["render done", "work"]


def test_a_render_that_never_ends_holds_the_work_up_to_wait_s_then_lets_it_run():
    gate = ScrapeFirst(wait_s=0.05, run_s=30)
    with gate.serving():
        gate.pause()  # waits wait_s, then the work runs run_s without waiting again
        gate.pause()
        gate.pause()
    assert gate.waits == 1
