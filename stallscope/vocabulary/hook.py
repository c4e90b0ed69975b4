"""What the hook's reports feed: per-rank data-wait and step time (part ``ranks``), the
loader's batch production and sizing (part ``loader``), shard reads and cache lookups
per pod and tier (part ``shards``)."""
# The report cadences, the contract between the hook and the agent, are declared beside
# these fields' producer, in stallscope/cadence.py: the hook in every training process
# reads them, and this package is more than a trainer should load.
from .entries import Metric, Signal
from .labels import LOADER_CONFIG, POD, RANK, TIER

# Data-wait spans 100 µs (a prefetched batch) to tens of seconds (a dead mount): ten
# buckets keep a rank's histogram at 12 series within the per-rank budget.
WAIT_BUCKETS = (0.0001, 0.0005, 0.002, 0.01, 0.05, 0.25, 1.0, 5.0, 30.0)
# Step and batch-load time are read through _sum and _count: a rough distribution, at 5
# series for the step (its 10 s bucket, which nothing read, made room in the per-rank
# budget for the transfer counter) and 6 for batch load.
# Step time is read through _sum/_count only: its histogram keeps one bucket (the per-rank
# series budget, 40: the steady data-wait counter took the other, issue 29).
STEP_BUCKETS: tuple[float, ...] = (1.0,)
LOAD_BUCKETS = (0.01, 0.1, 1.0)
# A page-cache hit (<1 ms) to a stuck network read (>2.5 s): 8 series per pod and tier.
READ_BUCKETS = (0.001, 0.01, 0.05, 0.25, 2.5)

METRICS = (
    Metric("stallscope_data_wait_seconds", "histogram",
           "Time the training loop blocked in next(loader), per batch. _sum includes a wait "
           "still in progress; _count moves when its batch arrives.", RANK, "ranks", WAIT_BUCKETS),
    Metric("stallscope_step_seconds", "histogram",
           "Interval between consecutive batches reaching the training loop (_sum, like the "
           "data-wait sum, includes a wait still in progress).", RANK, "ranks", STEP_BUCKETS),
    Metric("stallscope_loader_info", "gauge", "DataLoader configuration of the rank (value 1).",
           RANK + LOADER_CONFIG, "ranks"),
    # Pod-wide, not per rank (the per-rank budget): a rank whose loader raised stops.
    Metric("stallscope_loader_errors_total", "counter",
           "Trainer processes of the pod whose DataLoader raised out of next(), by the cause "
           "the error's message names (each from 0): shm_exhaustion (a failed /dev/shm "
           "allocation, or a worker's Bus error), other. A pod whose loader raised keeps them 15 "
           "minutes after its ranks are gone (the 256 most recent such pods); any other pod's go "
           "with its ranks.", POD + ("cause",), "ranks"),
    Metric("stallscope_hook_dropped_events_total", "counter",
           "Events the rank's hook could not deliver to the agent.", RANK, "ranks"),
    Metric("stallscope_steady_data_wait_seconds_total", "counter",
           "Data-wait of the batches that did not start an iterator (each epoch's first batch "
           "waits for its workers' start-up), counted when each batch arrives: the loader's "
           "steady pace. Its steady step time is the step sum less the data-wait sum (the "
           "loop's compute, to which an iterator's first batch adds nothing) plus this.",
           RANK, "ranks"),
    Metric("stallscope_batch_load_seconds", "histogram",
           "Time a loader worker took to produce one batch (fetch + collate).", RANK, "loader",
           LOAD_BUCKETS),
    Metric("stallscope_loader_workers_needed", "gauge",
           "Loader workers that would keep up with the loop: ceil(T_load / T_compute) over the "
           "last minute, capped by the pod's CPU quota.", RANK, "loader"),
    Metric("stallscope_loader_workers_quota_limited", "gauge",
           "1 when the CPU quota, not the worker count, limits the loader.", RANK, "loader"),
    Metric("stallscope_data_transfer_seconds_total", "counter",
           "Of the data-wait, the time the loop spent getting batches from the loader workers "
           "(receive, unpickle, the pin-memory thread, the loader's bookkeeping), not waiting "
           "for a worker's batch to be ready. Multi-process DataLoaders only.", RANK, "loader"),
    Metric("stallscope_shard_read_seconds", "histogram",
           "Latency of one shard read (open + reads), per pod and tier.", TIER, "shards",
           READ_BUCKETS),
    Metric("stallscope_shard_read_bytes_total", "counter",
           "Bytes of the shard reads reported by the loaders (adapters, stallscope.DatasetRoot), "
           "per pod and tier: what each tier served.", TIER, "shards"),
    Metric("stallscope_storage_requests_total", "counter",
           "Requests to a storage tier reported by the loaders (stallscope.storage_request), per "
           "pod and tier, by result: ok (2xx, 3xx), slow_down (429, 503), server_error (other "
           "5xx), client_error (4xx), timeout (no answer).", TIER + ("result",), "shards"),
    Metric("stallscope_storage_failed_requests_total", "counter",
           "Of those requests, the failed ones (slow_down, server_error, timeout: what a "
           "storage_errors cause counts), per pod and tier.", TIER, "shards"),
    Metric("stallscope_storage_retries_total", "counter",
           "Of those requests, the ones that repeated a failed one, per pod and tier.", TIER, "shards"),
    Metric("stallscope_cache_requests_total", "counter",
           "Cache lookups reported by the loaders, per pod and tier.", TIER + ("result",), "shards"),
    Metric("stallscope_agent_rejected_io_reports_total", "counter",
           "Shard-read/cache parts of hook reports ignored, by reason.", ("reason",), "shards"),
)

_BY_RANK = "sum by (namespace, job, rank, pod, node)"
SIGNALS = (
    Signal("batch_load_seconds", "seconds", ("rank",), "loader",
           "Time a loader worker took to produce one batch, one sample per batch.",
           "%s (rate(stallscope_batch_load_seconds_sum{$sel}[$w]))\n/\n"
           "%s (rate(stallscope_batch_load_seconds_count{$sel}[$w]))" % (_BY_RANK, _BY_RANK),
           ("namespace", "job", "rank", "pod", "node"), cadence="batch"),
    # Which worker made each batch (issue 18): the slow_worker cause splits the load times
    # by it. No Prometheus face: a series per worker PID would break the per-rank budget.
    Signal("batch_worker_pid", "pid", ("rank",), "loader",
           "Host PID of the loader worker that produced each batch, one sample per batch at "
           "the same time stamp as its batch_load_seconds sample.", cadence="batch"),
    # When each worker's reports were sent (issue 50): the analysis reads how far each
    # worker's batches have come from these, not from the hook's report cadence.
    Signal("worker_report_pid", "pid", ("rank",), "loader",
           "Host PID of the loader worker whose report (batches or a heartbeat) the agent "
           "took, one sample per report at the time the worker sent it: every batch the "
           "worker finished before then is in the batch_load_seconds samples."),
    Signal("transfer_wait_ratio", "ratio", ("rank",), "loader",
           "Share of the loop's data-wait spent on transfer (receiving, unpickling, pinning a "
           "batch) rather than waiting for a worker's batch to be ready, one sample per report.",
           "%s (rate(stallscope_data_transfer_seconds_total{$sel}[$w]))\n/\n"
           "%s (rate(stallscope_data_wait_seconds_sum{$sel}[$w]))" % (_BY_RANK, _BY_RANK),
           ("namespace", "job", "rank", "pod", "node"), cadence="batch"),
    Signal("shard_read_seconds", "seconds", ("rank",), "shards",
           "Latency of one shard read, one sample per read; in Prometheus its p99 per tier.",
           "histogram_quantile(0.99, sum by (namespace, pod, tier, le) "
           "(rate(stallscope_shard_read_seconds_bucket{$sel}[$w])))",
           ("namespace", "pod", "tier"), cadence="batch"),
    Signal("shard_read_bytes", "bytes", ("rank",), "shards",
           "Bytes of one shard read, one sample per read (time-stamped at its end); in "
           "Prometheus the bytes per second per tier.",
           "sum by (namespace, pod, tier) (rate(stallscope_shard_read_bytes_total{$sel}[$w]))",
           ("namespace", "pod", "tier"), cadence="batch"),
    Signal("storage_error_ratio", "ratio", ("rank",), "shards",
           "Share of the storage requests in one report that failed (slow_down, server_error, "
           "timeout); in Prometheus per tier.",
           "sum by (namespace, pod, tier) (rate(stallscope_storage_failed_requests_total{$sel}[$w]))"
           "\n/\nsum by (namespace, pod, tier) (rate(stallscope_storage_requests_total{$sel}[$w]))",
           ("namespace", "pod", "tier"), condition=True),
    Signal("cache_miss_ratio", "ratio", ("rank",), "shards",
           "Share of the cache lookups in one report that missed.",
           "sum by (namespace, pod, tier) (rate(stallscope_cache_requests_total{result=\"miss\",$sel}[$w]))"
           "\n/\nsum by (namespace, pod, tier) (rate(stallscope_cache_requests_total{$sel}[$w]))",
           ("namespace", "pod", "tier"), cadence="batch"),
)
