"""Synthetic node agents for the scale rig: N nodes' worth of what real agents serve.

Shape: the real agent's /metrics, taken from tests/golden/metrics.prom (the exposition a
real agent renders over the golden fixtures, rewritten by `pytest tests/golden --update`),
so metric names, label sets, bucket bounds and node-level series are exactly the agent's.
Each node gets 8 ranks in one pod (torchrun --nproc-per-node=8, a PyTorchJob/JobSet pod
per node), 8 GPUs, one FUSE mount, one shard tier. What an idle or healthy agent would
not serve is left out: per-worker series (off unless --exporter.workers.per-worker),
cause scores and the stall start of ranks that are not input-bound, worker exits, a
failing FUSE mount.

Values: every counter grows at a per-second rate from a simple healthy job (a step
every 0.5 s, data-wait 0.2-0.8 % per rank, CFS throttling 2 %); the straggler (a control
file names node, rank and onset) waits 50 % of each step from its onset on (enough for
the 5m ratio to cross the 2 % line within one scrape, so the time to the alert measures
the pipeline, not the window's arithmetic), with its
pod's CPU quota throttling half the periods, so the counters stay monotonic and the
rates change at the onset. Values depend only on the time, so several serving
processes (SO_REUSEPORT) agree without sharing state.

Run: python benchmarks/scale/agents.py --nodes 256 --port 19100 --control FILE
Targets: http://127.0.0.1:PORT/node/<i>/metrics; /node/<i>/api/... answers 404 (no
agent API here: diagnose then reports the node detail as unavailable).
"""
import argparse
import http.server
import json
import os
import re
import socket
import time
import zlib

from prometheus_client.parser import text_string_to_metric_families

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "metrics.prom")
RANKS_PER_NODE = 8
GPUS_PER_NODE = 8
NAMESPACE = "ml-train"
JOB = "llm-pretrain"
STEP = 0.5  # seconds per step, every rank
HISTORY = 3600.0  # counters start as if the job had run for an hour

LEFT_OUT = {"stallscope_loader_worker_cpu_seconds_total", "stallscope_loader_worker_resident_memory_bytes",
            "stallscope_loader_worker_exits_total", "stallscope_fuse_probe_failures_total",
            "stallscope_gpu_read_errors_total", "stallscope_agent_rejected_io_reports_total"}
STRAGGLER_ONLY = {"stallscope_stall_cause_score", "stallscope_stall_since_timestamp_seconds"}
CAUSES = {"cpu_throttle": 0.82, "too_few_workers": 0.11, "unexplained": 0.07}


def healthy_ratio(rank):
    """Data-wait share of a healthy rank: 0.2-0.8 %, fixed per rank."""
    return 0.002 + (zlib.crc32(b"%d" % rank) % 600) / 1e5


def wait_buckets(per_batch):
    """Share of batches at or under each data-wait bound, for waits near ``per_batch``."""
    return lambda le: 1.0 if le >= per_batch * 2 else (0.5 if le >= per_batch else 0.0)


def rank_rates(name, le, ratio, slow):
    """(value, is_counter) of a rank-labelled series: rate per second for counters."""
    r = 1.0 / STEP
    wait = 0.50 if slow else ratio
    load = 2.4 if slow else 0.8
    table = {
        "stallscope_data_wait_seconds_count": r, "stallscope_data_wait_seconds_sum": wait,
        "stallscope_step_seconds_count": r, "stallscope_step_seconds_sum": 1.0,
        "stallscope_steady_data_wait_seconds_total": wait,
        "stallscope_batch_load_seconds_count": r, "stallscope_batch_load_seconds_sum": r * load,
        "stallscope_hook_dropped_events_total": 0.0, "stallscope_data_transfer_seconds_total": wait * 0.05,
        "stallscope_loader_workers_cpu_seconds_total": 1.6, "stallscope_gpu_busy_seconds_total": 0.95 - wait,
    }
    if name in table:
        return table[name], True
    if name == "stallscope_data_wait_seconds_bucket":
        return r * wait_buckets(wait * STEP)(le), True
    if name == "stallscope_step_seconds_bucket":
        return r * (1.0 if le >= STEP else 0.0), True
    if name == "stallscope_batch_load_seconds_bucket":
        return r * (1.0 if le >= load else 0.0), True
    gauges = {"stallscope_loader_info": 1.0, "stallscope_loader_workers_needed": 5.0 if slow else 2.0,
              "stallscope_loader_workers_quota_limited": 1.0 if slow else 0.0,
              "stallscope_loader_workers_alive": 4.0, "stallscope_loader_workers_dstate": 0.0,
              "stallscope_loader_worker_max_resident_memory_bytes": 2.7e8,
              "stallscope_gpu_busy_ratio": 0.95 - wait,
              "stallscope_gpu_idle_overlap_ratio": 0.9 if slow else 0.1,
              "stallscope_stall_period_steps": 0.0}
    return gauges[name], False


def pod_rates(name, labels, slow):
    """(value, is_counter) of a pod- or node-level series (node-level: pod="")."""
    node_wide = labels.get("pod", "") == ""
    le = float(labels["le"]) if "le" in labels else None
    counters = {
        "stallscope_cpu_cfs_periods_total": 10.0,
        "stallscope_cpu_cfs_throttled_periods_total": 5.0 if slow else 0.2,
        "stallscope_cpu_cfs_throttled_seconds_total": 0.4 if slow else 0.005,
        "stallscope_pressure_cpu_waiting_seconds_total": 0.06 if node_wide else (0.4 if slow else 0.03),
        "stallscope_pressure_cpu_stalled_seconds_total": 0.0 if node_wide else 0.01,
        "stallscope_pressure_io_waiting_seconds_total": 0.02,
        "stallscope_pressure_io_stalled_seconds_total": 0.01,
        "stallscope_pressure_memory_waiting_seconds_total": 0.001,
        "stallscope_pressure_memory_stalled_seconds_total": 0.0005,
        "stallscope_shard_read_seconds_count": 4.0, "stallscope_shard_read_seconds_sum": 0.03,
        "stallscope_cache_requests_total": 9.0 if labels.get("result") == "hit" else 1.0,
        "stallscope_agent_messages_total": 4.0 * RANKS_PER_NODE,
        "stallscope_agent_events_total": 2.0 * RANKS_PER_NODE,
        "stallscope_correlator_runs_total": 0.2, "stallscope_agent_http_requests_total":
            (1 / 15.0) if labels.get("code") == "2xx" else 0.0,
    }
    if name in counters:
        return counters[name], True
    if name == "stallscope_shard_read_seconds_bucket":
        return 4.0 * (1.0 if le >= 0.05 else 0.8 if le >= 0.01 else 0.0), True
    if name.endswith("_total"):
        return 0.0, True
    gauges = {"stallscope_cpu_cfs_quota_cores": 16.0, "stallscope_cpu_cfs_quota_oversubscribed": 0.0,
              "stallscope_shm_size_bytes": 6.4e10 if node_wide else 8.6e9,
              "stallscope_shm_used_bytes": 2.1e9 if node_wide else 1.1e9,
              "stallscope_fuse_up": 1.0, "stallscope_fuse_probe_seconds": 0.004,
              "stallscope_fuse_waiting_requests": 0.0, "stallscope_agent_ranks": float(RANKS_PER_NODE),
              "stallscope_agent_max_ranks": 32.0, "stallscope_gpu_sm_active_ratio": 0.8,
              "stallscope_exporter_duration_seconds": 0.01, "stallscope_correlator_duration_seconds": 0.05}
    return gauges.get(name, 1.0 if name.endswith(("_up", "_success", "_available", "_info")) else 0.0), False


def _fmt(labels):
    return "{%s}" % ",".join('%s="%s"' % (k, v) for k, v in sorted(labels.items())) if labels else ""


def golden_samples():
    """[(name, labels)] of the golden page, with the families' shape and nothing else."""
    out = []
    for family in text_string_to_metric_families(open(GOLDEN).read()):
        for s in family.samples:
            if s.name in LEFT_OUT or "worker" in s.labels or s.labels.get("mountpoint") == "/loop":
                continue
            out.append((s.name, dict(s.labels)))
    return out


class Node:
    """The series of node ``i``: [(prefix, healthy (value, counter), straggler value or None)]."""

    def __init__(self, i, samples):
        self.name = "node-%05d" % i
        self.pod = "%s-worker-%d" % (JOB, i)
        self.series = []  # (prefix, rank or None, value, counter, slow value)
        first_rank = i * RANKS_PER_NODE
        for name, labels in samples:
            rank = labels.get("rank", "")
            labels = dict(labels)
            if "node" in labels:  # the agent's own series carry none: the scrape's instance tells them apart
                labels["node"] = self.name
            if labels.get("pod"):
                labels.update(pod=self.pod, namespace=NAMESPACE, job=JOB)
            if "uuid" in labels and rank == "":  # one per GPU of the node (gpu_up, SM active)
                if labels.get("gpu") != "0":
                    continue
                for g in range(GPUS_PER_NODE):
                    lab = dict(labels, gpu=str(g), uuid="GPU-%08x-%d" % (i, g))
                    self.add(name, lab, None)
            elif rank != "":
                if name == "stallscope_stall_cause_score" and labels["cause"] != "too_few_workers":
                    continue
                for r in range(first_rank, first_rank + RANKS_PER_NODE):
                    if "uuid" in labels:
                        labels.update(gpu=str(r % GPUS_PER_NODE), uuid="GPU-%08x-%d" % (i, r % GPUS_PER_NODE))
                    if name == "stallscope_stall_cause_score":
                        for cause in CAUSES:
                            self.add(name, dict(labels, rank=str(r), cause=cause), r)
                    else:
                        self.add(name, dict(labels, rank=str(r)), r)
            else:
                self.add(name, labels, None)

    def add(self, name, labels, rank):
        prefix = name + _fmt(labels)
        if rank is None:
            healthy, slow = pod_rates(name, labels, False), pod_rates(name, labels, True)
        elif name in STRAGGLER_ONLY:
            healthy, slow = None, (CAUSES.get(labels.get("cause"), 0.0), False)
        else:
            le = float(labels["le"]) if "le" in labels else None
            ratio = healthy_ratio(rank)
            healthy, slow = rank_rates(name, le, ratio, False), rank_rates(name, le, ratio, True)
        self.series.append((prefix, rank, healthy, slow, name))

    def render(self, now, t0, straggler):
        """The page at ``now``; ``straggler`` is (rank, onset) when it is on this node."""
        lines = []
        for prefix, rank, healthy, slow, name in self.series:
            affected = straggler is not None and (rank is None or rank == straggler[0])
            if healthy is None and not affected:
                continue
            if affected and now > straggler[1]:
                onset = straggler[1]
                if name == "stallscope_stall_since_timestamp_seconds":
                    v = onset
                elif healthy is None or not healthy[1]:
                    v = slow[0]
                else:
                    v = healthy[0] * (onset - t0) + slow[0] * (now - onset)
            elif healthy is None:
                continue
            else:
                v = healthy[0] * (now - t0) if healthy[1] else healthy[0]
            lines.append("%s %.6f" % (prefix, v))
        lines.append("")
        return "\n".join(lines).encode()


class Control:
    """The straggler named in the control file ({"node", "rank", "onset"}), read at most once a second."""

    def __init__(self, path):
        self.path, self.read_at, self.value = path, 0.0, None

    def get(self):
        now = time.monotonic()
        if now - self.read_at > 1.0:
            self.read_at = now
            try:
                with open(self.path) as f:
                    d = json.load(f)
                self.value = (int(d["node"]), int(d["rank"]), float(d["onset"]))
            except (OSError, ValueError, KeyError):
                self.value = None
        return self.value


PATH = re.compile(r"^/node/(\d+)/metrics$")


def serve(nodes, port, control_path):
    samples = golden_samples()
    built = {}
    control = Control(control_path)
    t0 = time.time() - HISTORY

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            m = PATH.match(self.path)
            if not m or int(m.group(1)) >= nodes:
                body, code, ctype = b'{"error": "synthetic agent: no API"}\n', 404, "application/json"
            else:
                i = int(m.group(1))
                node = built.get(i) or built.setdefault(i, Node(i, samples))
                s = control.get()
                straggler = (s[1], s[2]) if s and s[0] == i else None
                body, code, ctype = node.render(time.time(), t0, straggler), 200, "text/plain; version=0.0.4"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

        def server_bind(self):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    Server(("127.0.0.1", port), Handler).serve_forever()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--control", required=True, help="JSON file naming the straggler (node, rank, onset)")
    a = ap.parse_args()
    serve(a.nodes, a.port, a.control)


if __name__ == "__main__":
    main()
