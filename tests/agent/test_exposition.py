"""The agent's /metrics renderer (stallscope/agent/web/exposition.py) against
prometheus_client's generate_latest: the same bytes for the same metric families, the
real agent's (the golden run of tests/golden) and every case generate_latest treats
apart (escaping, special values, counters' _total and _created, histograms, gauge
histograms, info, stateset, unknown, timestamps)."""
import time

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.samples import Sample

from stallscope.agent.main import Agent, AgentOptions, Config
from stallscope.agent.web.exposition import Exposition
from tests.helpers import golden as helpers
from tests.helpers.correlate import report


def expected(families):
    return generate_latest(helpers.Collected(families))


def tricky_families():
    odd = ['back\\slash', 'quote"d', 'new\nline', 'all \\"\n three', "", "é ünïcode", "{braces},="]
    g = GaugeMetricFamily("t_gauge", 'Help with \\ backslash,\nnewline and "quotes".',
                          labels=["value", "z_last", "a_first"])
    for i, v in enumerate(odd):
        g.add_metric([v, "z%d" % i, "a"], i)
    values = GaugeMetricFamily("t_values", "Special values.", labels=["v"])
    for i, x in enumerate([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 3, True, 1e-9,
                           12345678.9, 1234567.0, 1e16, 1e22, -12345678.9, 0.1 + 0.2, 2**53 + 1]):
        values.add_metric([str(i)], x)
    stamped = GaugeMetricFamily("t_stamped", "With timestamps.", labels=["k"])
    stamped.add_metric(["a"], 1.5, timestamp=1700000000.123)
    stamped.add_metric(["b"], 2, timestamp=time.time())
    c1 = CounterMetricFamily("t_requests", "A counter with _created.", labels=["code"], created=1234.5)
    c1.add_metric(["500"], 7, created=99.25)
    c2 = CounterMetricFamily("t_bytes_total", "Declared with _total.", value=1e10)
    h = HistogramMetricFamily("t_latency_seconds", "A histogram.", labels=["rank"])
    for r in ("0", "1"):
        h.add_metric([r], [("0.005", 1), ("0.1", 3), ("+Inf", 4)], 0.25)
    hc = Metric("t_created_hist", "A histogram with _created.", "histogram")
    hc.add_sample("t_created_hist_bucket", {"le": "+Inf"}, 1)
    hc.add_sample("t_created_hist_count", {}, 1)
    hc.add_sample("t_created_hist_sum", {}, 0.5)
    hc.add_sample("t_created_hist_created", {}, 1000.0)
    gh = GaugeHistogramMetricFamily("t_queue", "A gauge histogram.", buckets=[("1", 2), ("+Inf", 5)],
                                    gsum_value=7)
    info = InfoMetricFamily("t_build", "Info.", value={"version": "1.2\n3", "commit": "abc"})
    state = StateSetMetricFamily("t_state", "A stateset.", value={"on": True, "off": False})
    unknown = UnknownMetricFamily("t_unknown", "Unknown type.", value=42)
    summary = SummaryMetricFamily("t_summary", "A summary.", count_value=3, sum_value=1.5)
    empty = GaugeMetricFamily("t_empty", "No samples.")
    return [g, values, stamped, c1, c2, h, hc, gh, info, state, unknown, summary, empty]


def test_the_real_agents_families_render_to_generate_latests_bytes():
    run = helpers.golden_run()
    assert len(run.families) > 50
    ex = Exposition()
    for _ in range(2):  # the second time from the label cache
        got = ex.render(run.families)
        assert got == run.exposition.encode()


def test_every_case_generate_latest_treats_apart_renders_the_same():
    fams = tricky_families()
    want = expected(fams)
    for ex in (Exposition(), Exposition(max_cached=2)):  # and with the label cache overflowing
        for _ in range(3):
            assert ex.render(fams) == want
    # each case on its own too: a difference names its family
    for f in fams:
        assert Exposition().render([f]) == expected([f]), f.name
    text = want.decode()
    assert '{a_first="a",value="all \\\\\\"\\n three",z_last="z3"}' in text  # sorted, escaped
    assert "+Inf" in text and "NaN" in text and "1.23456789e+07" in text


def test_a_failing_family_raises_as_generate_latest_does():
    bad = GaugeMetricFamily("t_bad", "A label value that is not a string.")
    bad.samples.append(Sample("t_bad", {"k": 1}, 1.0))  # what add_metric would refuse
    for render in (lambda: Exposition().render([bad]), lambda: expected([bad])):
        try:
            render()
        except AttributeError:
            continue
        raise AssertionError("rendered a non-string label value")


def test_parts_render_the_registrys_series_in_its_order(tmp_path):
    agent = Agent(Config(agent=AgentOptions(socket=str(tmp_path / "s.sock"), max_ranks=8),
                         enabled={"gpu": False}))
    now = time.monotonic_ns()
    for r in range(4):
        agent.apply(report("bench", r, "pod-%d" % r, [(now - (9 - i) * 10**7, 10**6, 10**7)
                                                      for i in range(9)]))
    rendered = agent.parts.render().decode()
    want = generate_latest(agent.registry).decode()

    def shape(text):  # the values of a few gauges (durations, RSS) move between two collections
        return [line.rsplit(" ", 1)[0] if not line.startswith("#") else line for line in text.splitlines()]
    assert shape(rendered) == shape(want)
    assert 'stallscope_data_wait_seconds_count{job="bench"' in rendered


def test_the_label_cache_holds_the_live_series_not_every_rank_ever_seen():
    # Ranks of short jobs come and go: each scrape exports 100 series of ranks that were
    # not there the scrape before. The cache kept every label set up to 200,000 (~40 MB)
    # before starting again; settle() after each scrape keeps it near the live series.
    ex = Exposition()
    for scrape in range(60):
        g = GaugeMetricFamily("t_wait", "Per rank.", labels=["job", "rank"])
        for rank in range(100):
            g.add_metric(["job%d" % scrape, str(rank)], float(rank))
        text = ex.render([g]).decode()
        ex.settle()
        assert 't_wait{job="job%d",rank="99"} 99.0' % scrape in text
        assert len(ex._prefixes) <= 2 * 100 + 1024
    steady = Exposition()  # the same series every scrape: the cache is kept, not rebuilt
    g = GaugeMetricFamily("t_wait", "Per rank.", labels=["rank"])
    for rank in range(3000):
        g.add_metric([str(rank)], 1.0)
    steady.render([g])
    steady.settle()
    kept = steady._prefixes
    steady.render([g])
    steady.settle()
    assert steady._prefixes is kept and len(kept) == 3000
