"""The agent's own series: ingest and rank-table health (part ``ranks``), the exporters'
self-health (part ``exporters``), and the correlator's outputs (part ``correlator``)."""
from .entries import Metric
from .labels import RANK

METRICS = (
    Metric("stallscope_agent_messages_total", "counter", "Hook messages accepted.", (), "ranks"),
    Metric("stallscope_agent_events_total", "counter", "Batch events accepted from hooks.", (), "ranks"),
    Metric("stallscope_agent_rejected_messages_total", "counter", "Hook messages rejected, by reason.",
           ("reason",), "ranks"),
    Metric("stallscope_agent_rank_evictions_total", "counter", "Ranks dropped from the table, by reason.",
           ("reason",), "ranks"),
    Metric("stallscope_agent_ranks", "gauge", "Ranks tracked on this node.", (), "ranks"),
    Metric("stallscope_agent_max_ranks", "gauge", "Cap on tracked ranks.", (), "ranks"),
    Metric("stallscope_agent_connections", "gauge", "Open hook connections.", (), "ranks"),
    Metric("stallscope_agent_build_info", "gauge", "Agent version (value 1).", ("version", "node"),
           "ranks"),
    Metric("stallscope_agent_part_errors_total", "counter",
           "Failed collections of an agent part at scrape time (its series were left out).",
           ("part",), "agent"),
    Metric("stallscope_exporter_success", "gauge",
           "1 if the exporter's last collection succeeded within its deadline.", ("exporter",),
           "exporters"),
    Metric("stallscope_exporter_duration_seconds", "gauge",
           "Wall time of the exporter's last collection (of the one in progress, once past its "
           "deadline).", ("exporter",), "exporters"),
    Metric("stallscope_exporter_available", "gauge", "1 if the exporter's signal exists on this node.",
           ("exporter",), "exporters"),
    Metric("stallscope_gpu_idle_overlap_ratio", "gauge",
           "Share of the rank's GPU-idle time that overlaps its data-wait (correlator).", RANK,
           "correlator"),
    Metric("stallscope_stall_period_steps", "gauge",
           "Dominant period of the rank's data-wait stalls in batches; 0 if none.", RANK, "correlator"),
    Metric("stallscope_stall_cause_score", "gauge",
           "Correlator score (0-1) of a candidate stall cause; top 3 causes of an input-bound rank.",
           RANK + ("cause",), "correlator"),
    Metric("stallscope_correlator_runs_total", "counter", "Scheduled correlator runs.", (), "correlator"),
    Metric("stallscope_correlator_failures_total", "counter", "Failed correlator runs.", (), "correlator"),
    Metric("stallscope_correlator_duration_seconds", "gauge",
           "Duration of the last scheduled correlator run.", (), "correlator"),
)
