"""The agent's own metric families: per-rank hook data and ingest self-health.

``collect()`` builds fresh families from a snapshot on every scrape (client_python's
custom-collector pattern), so an expired rank's series simply stop being exported.
"""
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

from .. import __version__
from .state import LABELS

LOADER_LABELS = LABELS + ("num_workers", "prefetch_factor", "pin_memory",
                          "persistent_workers", "batch_size")


def _str(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class RankCollector:
    def __init__(self, table, ingest):
        self.table = table
        self.ingest = ingest

    def describe(self):
        return []

    def collect(self):
        ranks = self.table.snapshot()
        wait = HistogramMetricFamily(
            "stallscope_data_wait_seconds",
            "Time the training loop blocked in next(loader), per batch. _sum includes a wait "
            "still in progress; _count moves when its batch arrives.", labels=LABELS)
        step = HistogramMetricFamily(
            "stallscope_step_seconds",
            "Interval between consecutive batches reaching the training loop (_sum, like "
            "the data-wait sum, includes a wait still in progress).", labels=LABELS)
        info = GaugeMetricFamily(
            "stallscope_loader_info", "DataLoader configuration of the rank (value 1).",
            labels=LOADER_LABELS)
        dropped = CounterMetricFamily(
            "stallscope_hook_dropped_events",
            "Events the rank's hook could not deliver to the agent.", labels=LABELS)
        with self.table.lock:
            for r in ranks:
                lv = r.labels()
                wait.add_metric(lv, r.wait.cumulative(), r.wait.sum_ns / 1e9)
                step.add_metric(lv, r.step.cumulative(), r.step.sum_ns / 1e9)
                if r.loader is not None:
                    info.add_metric(lv + tuple(_str(r.loader.get(k)) for k in LOADER_LABELS[5:]), 1)
                dropped.add_metric(lv, r.dropped_total)
            evictions = dict(self.table.evictions)
        yield wait
        yield step
        yield info
        yield dropped
        yield from self._self_health(len(ranks), evictions)

    def _self_health(self, n_ranks, evictions):
        ing = self.ingest
        yield CounterMetricFamily("stallscope_agent_messages",
                                  "Hook messages accepted.", value=ing.accepted)
        yield CounterMetricFamily("stallscope_agent_events",
                                  "Batch events accepted from hooks.", value=ing.events)
        rej = CounterMetricFamily("stallscope_agent_rejected_messages",
                                  "Hook messages rejected, by reason.", labels=["reason"])
        for reason, n in sorted(dict(ing.rejected).items()):
            rej.add_metric([reason], n)
        yield rej
        ev = CounterMetricFamily("stallscope_agent_rank_evictions",
                                 "Ranks dropped from the table, by reason.", labels=["reason"])
        for reason in ("exited", "silent"):
            ev.add_metric([reason], evictions.get(reason, 0))
        yield ev
        yield GaugeMetricFamily("stallscope_agent_ranks", "Ranks tracked on this node.", value=n_ranks)
        yield GaugeMetricFamily("stallscope_agent_max_ranks", "Cap on tracked ranks.",
                                value=self.table.max_ranks)
        yield GaugeMetricFamily("stallscope_agent_connections", "Open hook connections.",
                                value=ing.connections)
        b = GaugeMetricFamily("stallscope_agent_build_info", "Agent version (value 1).",
                              labels=["version", "node"])
        b.add_metric([__version__, self.table.node], 1)
        yield b
