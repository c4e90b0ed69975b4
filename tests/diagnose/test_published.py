"""What the agent published last, as Prometheus holds it (issue 49): the Prometheus path
reads the correlator's cause scores and time budget per scrape; a series the agent stopped
publishing inside the window (a cause that fell out of its top three, a budget component
that went) must not be read beside the ones that replaced it. A real Prometheus backfilled
with two minutes of scrapes (promtool), one cause and one component dropped a minute
before the end: last_over_time over the window still returned them (a drawn cache-miss
run read epoch_start first from Prometheus, a score the agent had dropped)."""
import time

import pytest

from stallscope.diagnose import cluster
from stallscope.diagnose.document import JobRank
from stallscope.diagnose.prom import Prometheus
from tests.helpers import backfill
from tests.helpers.needs import need_prometheus

SCRAPE = 15.0
IDS = dict(job="pj", namespace="ml", rank="0", pod="pj-0", node="n1", instance="127.0.0.1:1")


def _key(name, **labels):
    return tuple(sorted(dict(labels, __name__=name).items()))


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    need_prometheus()
    end = time.time() - 30
    ticks = [end - 120 + i * SCRAPE for i in range(int(120 / SCRAPE) + 1)]
    early = [t for t in ticks if t <= end - 60]
    pod = {k: v for k, v in IDS.items() if k != "rank"}
    series = {
        _key("stallscope_stall_cause_score", cause="too_few_workers", **IDS): [(t, 0.8) for t in ticks],
        _key("stallscope_stall_cause_score", cause="epoch_start", **IDS): [(t, 0.9) for t in early],
        _key("stallscope_stall_budget_ratio", component="workers.on_cpu", cause="too_few_workers",
             **pod): [(t, 0.7) for t in ticks],
        _key("stallscope_stall_budget_ratio", component="workers.storage", cause="storage_latency",
             **pod): [(t, 0.5) for t in early],
    }
    prom = backfill.serve(series, str(tmp_path_factory.mktemp("published") / "prom"))
    try:
        yield Prometheus(prom.url, now=end + 5), end
    finally:
        prom.stop()


def test_the_scores_and_budget_the_agent_published_last(published):
    prom, end = published
    who = JobRank(rank="0", pod="pj-0", node="n1", data_wait_ratio=0.3, namespace="ml", job="pj")
    assert cluster.cause_scores(prom, who, "2m") == [("too_few_workers", 0.8)]
    assert cluster.budget_shares(prom, who, "2m") == [("workers.on_cpu", "too_few_workers", 0.7)]
    # the dropped ones are in the window: only what the agent published last is read
    old = prom.query('last_over_time(stallscope_stall_cause_score{pod="pj-0"}[2m])')
    assert {labels["cause"] for labels, _ in old} == {"too_few_workers", "epoch_start"}
    # and the newest scrape that had any, once the job's series stopped: its last answer
    later = Prometheus(prom.url, now=end + 90)
    assert cluster.cause_scores(later, who, "5m") == [("too_few_workers", 0.8)]
