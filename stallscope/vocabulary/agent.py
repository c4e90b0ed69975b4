"""The agent's own series: ingest and rank-table health (part ``ranks``), the exporters'
self-health (part ``exporters``), and the correlator's outputs (part ``correlator``)."""
from .entries import Metric
from .labels import POD, RANK

# A departed pod's per-pod counters (worker exits, loader errors) are kept for the alerts
# that read their increase, for at most this many departed pods, the most recently seen:
# 10,000 short-lived pods left ~47,000 series for 900 s, bounded by nothing (issues 33, 50).
DEPARTED_PODS_KEPT = 256

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
    Metric("stallscope_agent_connections_closed_total", "counter",
           "Hook connections the agent closed, by reason: idle (nothing sent within "
           "--hook-idle-timeout; a hook reports at least every 5 s and reconnects). Connections "
           "refused at accept are counted as rejected messages (too_many_connections, "
           "too_many_connections_per_sender, too_many_connections_per_process).", ("reason",), "ranks"),
    Metric("stallscope_agent_held_messages", "gauge",
           "Loader workers' reports waiting for their trainer's first report (held up to 10 s).",
           (), "ranks"),
    Metric("stallscope_agent_pod_identity_up", "gauge",
           "1 while the pod names reports claim are checked against this node's pods from the "
           "Kubernetes API server; 0 when that is off or unavailable (then names are checked by "
           "sender domain only).", (), "ranks"),
    Metric("stallscope_agent_socket_recreated_total", "counter",
           "Times the hook socket file was found gone or replaced and bound again.", (), "ranks"),
    Metric("stallscope_agent_refused_worker_pids_total", "counter",
           "Loader worker PIDs a trainer reported that do not descend from it (never read).",
           (), "ranks"),
    Metric("stallscope_agent_name_bindings", "gauge",
           "Pod names bound to their first claimant's domain (uid and cgroup, or pod) beyond their "
           "ranks' lives: no other domain may report as them (names.py).", (), "ranks"),
    Metric("stallscope_agent_name_bindings_evicted_total", "counter",
           "Name bindings evicted to stay within their caps (4,096 names, 8 MiB): the oldest of "
           "the uid holding the most.", (), "ranks"),
    Metric("stallscope_agent_name_bindings_released_total", "counter",
           "Name bindings released because a cgroup of their claimant no longer exists (a "
           "finished job), so another domain could claim the name.", (), "ranks"),
    Metric("stallscope_agent_allowlist_reload_failures_total", "counter",
           "Reloads of --identity.allow refused (the file unreadable or a bad line: the names "
           "loaded before stay in force).", (), "ranks"),
    Metric("stallscope_agent_build_info", "gauge", "Agent version (value 1).", ("version", "node"),
           "ranks"),
    Metric("stallscope_agent_part_errors_total", "counter",
           "Failed collections of an agent part at scrape time (its series were left out).",
           ("part",), "agent"),
    Metric("stallscope_agent_http_connections", "gauge",
           "Open connections to the agent's HTTP server.", (), "agent"),
    Metric("stallscope_agent_http_connections_dropped_total", "counter",
           "HTTP connections the agent closed or refused to protect itself, by reason: evicted "
           "(the longest waiting for a request, to admit a new one), refused (all busy: 503), "
           "idle (no request within the idle or first-request timeout), timeout (a request head "
           "or a response not through in time).", ("reason",), "agent"),
    Metric("stallscope_agent_http_requests_total", "counter",
           "HTTP requests answered, by status class (2xx, 4xx, 5xx).", ("code",), "agent"),
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
    Metric("stallscope_stall_budget_ratio", "gauge",
           "Share of the steady wait held by each component of the time budget (the correlator's, "
           "correlate/budget.py) of the pod's most-waiting input-bound rank, with the cause the "
           "component names in its context; components of 1 % or more. Per pod, off the per-rank "
           "series budget.", POD + ("component", "cause"), "correlator"),
    Metric("stallscope_stall_since_timestamp_seconds", "gauge",
           "While a stall of the rank is detected (a change point of its data-wait share), "
           "when it began (Unix time).", RANK, "correlator"),
    Metric("stallscope_correlator_runs_total", "counter", "Scheduled correlator runs.", (), "correlator"),
    Metric("stallscope_correlator_failures_total", "counter", "Failed correlator runs.", (), "correlator"),
    Metric("stallscope_correlator_duration_seconds", "gauge",
           "Duration of the last scheduled correlator run.", (), "correlator"),
)
