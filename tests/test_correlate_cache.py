import numpy as np

from stallscope.agent.arrays import ArrayCache
from stallscope.correlate.trace import events_array, points_array


def test_only_new_points_are_converted_and_old_ones_trimmed():
    calls = []

    def convert(items):
        calls.append(len(items))
        return points_array(items)

    cache = ArrayCache()
    pts = [(i, float(i) / 2) for i in range(100)]
    a = cache.array("k", pts, convert)
    window = pts[10:] + [(i, float(i) / 2) for i in range(100, 105)]  # 10 dropped, 5 new
    b = cache.array("k", window, convert)
    assert calls == [100, 5]
    assert (b == points_array(window)).all()
    assert cache.hits == 1 and cache.misses == 1 and len(a) == 100


def test_anything_but_a_sliding_window_is_converted_afresh():
    cache = ArrayCache()
    ev = [(10 * i, 1, 10) for i in range(50)]
    cache.array("e", ev[20:], events_array)
    longer = cache.array("e", ev, events_array)  # reaches further back than cached
    assert (longer == events_array(ev)).all()
    shuffled = ev[:10] + ev[11:] + [ev[10]]  # last row found, but the rows differ
    got = cache.array("e", shuffled, events_array)
    assert (got == events_array(shuffled)).all()
    assert cache.misses == 3
    assert len(cache.array("e", [], events_array)) == 0


def test_prune_forgets_unused_series():
    cache = ArrayCache()
    cache.array("a", [(1, 1.0)], points_array)
    cache.prune()
    cache.array("b", [(1, 1.0)], points_array)
    cache.prune()
    assert set(cache.entries) == {"b"}


def test_agent_traces_with_and_without_cache_agree(tmp_path):
    import time

    from stallscope.agent.main import Agent, AgentOptions, Config
    from tests.correlate_helpers import report

    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock"), node="n")))
    now = time.monotonic_ns()
    ev = [(now - (300 - i) * 10 ** 8, 10 ** 6, 10 ** 8) for i in range(300)]
    agent.table.apply(report("j", 0, "p", ev[:200]))
    for i in range(200):
        agent.samples.record("node", "psi_io_some_ratio", i / 200, now - (200 - i) * 10 ** 8)
    cache = ArrayCache()
    rank = agent.table.snapshot()[0]
    agent.correlator.trace(rank, 60, cache=cache)
    agent.table.apply(report("j", 0, "p", ev[200:]))
    agent.samples.record("node", "psi_io_some_ratio", 0.5, now)
    warm = agent.correlator.trace(rank, 60, cache=cache)
    cold = agent.correlator.trace(rank, 60)
    assert cache.hits >= 2
    assert np.array_equal(warm.t_end, cold.t_end) and np.array_equal(warm.wait, cold.wait)
    a, b = warm.node_signals["psi_io_some_ratio"], cold.node_signals["psi_io_some_ratio"]
    assert np.array_equal(a.t, b.t) and np.array_equal(a.v, b.v)
