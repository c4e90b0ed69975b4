"""Memory with a ceiling (issue 14): every per-rank history is a fixed-capacity ring sized
from --max-ranks and --timeline-seconds, so however long or fast ranks report, what the
agent holds for them stays at the figure it prints at start."""
import time

import numpy as np

from stallscope.agent.budget import Budget
from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.agent.rings import Ring
from tests.helpers.correlate import report


def test_a_ring_keeps_the_newest_rows_in_order():
    r = Ring(5, 3)
    for k in range(4):
        r.extend(np.array([[3 * k + i, 0, 0] for i in range(3)], np.int64))
    assert r.rows()[:, 0].tolist() == [7, 8, 9, 10, 11] and len(r) == 5
    r.extend(np.array([[100 + i, 0, 0] for i in range(9)], np.int64))  # more than it holds
    assert r.rows()[:, 0].tolist() == [104, 105, 106, 107, 108]
    assert r.since(106)[:, 0].tolist() == [106, 107, 108]


def test_history_stays_within_the_printed_ceiling(tmp_path):
    opts = AgentOptions(socket=str(tmp_path / "s.sock"), max_ranks=4, timeline_seconds=60)
    agent = Agent(Config(agent=opts, enabled={"gpu": False}))
    budget = Budget(4, 60)
    assert "memory ceiling" in budget.describe()
    now = time.monotonic_ns()
    for rank in range(4):
        for chunk in range(20):  # 20,000 batches a rank: far more than 60 s x 20/s
            events = [(now - (20000 - (chunk * 1000 + i)) * 10**6, 10**5, 10**6) for i in range(1000)]
            agent.apply(report("mem", rank, "p", events))
            agent.samples.record_many(("mem", rank), "batch_load_seconds",
                                      [e[0] for e in events], [0.01] * len(events))
    for r in agent.table.snapshot():
        assert len(r.timeline) == budget.events == 1200  # capped, the newest kept
        assert r.timeline.rows()[-1, 0] == now - 10**6
        assert r.wait.count == 20000  # the histograms still count every batch
    held = sum(r.timeline.nbytes for r in agent.table.snapshot()) + agent.samples.nbytes()
    assert held <= budget.history_bytes()


def test_a_workers_report_before_its_trainers_first_is_held_then_applied(tmp_path):
    from stallscope.agent.held import HELD

    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock")), enabled={"gpu": False}))
    now = time.monotonic_ns()
    worker = dict(report("held", 0, "p", [(now - 10**9, 3 * 10**8, 4 * 10**8)]), role="worker")
    assert agent.apply(worker) is HELD and len(agent.held) == 1
    agent.apply(report("held", 0, "p", [(now, 10**6, 10**8)]))
    assert len(agent.held) == 0 and agent.stats.accepted == 1  # the held one, applied
    assert agent.loader.states[("ns", "p", "held", 0)].hist.count == 1
    agent.apply(dict(report("held", 1, "p", []), role="worker"))
    agent.held.expire(agent._expire_held, now=time.monotonic() + 60)  # its trainer never came
    assert agent.stats.rejected["unknown_rank"] == 1 and len(agent.held) == 0


def test_held_reports_survive_the_jobs_thread_expiring_them_meanwhile():
    # The ingest thread takes a rank's held reports while the jobs thread expires old ones:
    # a 1M-message fuzz run caught "deque mutated during iteration" (an internal_error
    # reject) before Held had a lock.
    import threading

    from stallscope.agent.held import Held

    held = Held(hold_s=0.0005, max_held=4096)
    errors, stop = [], threading.Event()

    def expire():
        while not stop.is_set():
            held.expire(lambda: None)

    t = threading.Thread(target=expire)
    t.start()
    try:
        for i in range(20000):
            held.hold(("j", i % 7), {}, None)
            try:
                held.take(("j", (i + 3) % 7))
            except RuntimeError as e:
                errors.append(e)
                break
    finally:
        stop.set()
        t.join()
    assert errors == []
