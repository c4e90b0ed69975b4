"""The hook → agent wire format (version 1).

One JSON object per message on a unix SOCK_SEQPACKET connection, at most
MAX_MESSAGE_BYTES. No pickle: the agent
parses input from every process on the node and must not execute any of it.

    {"v": 1, "kind": "report",
     "id": {"job": str, "rank": int, "local_rank": int, "world_size": int,
            "pod": str, "namespace": str, "node": str},
     "pid": int,                  # the sender's own PID (its namespace; the agent
                                  #   trusts the kernel's SO_PEERCRED over this)
     "role": "main" | "worker",   # trainer process or a DataLoader worker
     "mono_ns": int, "wall_ns": int,   # one clock pair, to map monotonic → wall time
     "dropped_total": int,        # events this process could not deliver, cumulative
     "events": [[t_end_ns, wait_ns, interval_ns], ...],   # one per batch (role=main);
                                  #   role=worker: [t_end_ns, load_ns, interval_ns], the
                                  #   time to produce the batch (hook/batches.py)
     "blocked_since_ns": int,     # optional: the loop is inside next() since then and the
                                  #   batch has not come (the agent counts the wait so far)
     "io": {...},                 # optional: shard reads, cache lookups (hook/shards.py)
     "loader": {...},             # optional: DataLoader config + worker PIDs
     "cuda": {"index": int, "uuid": "GPU-..."},  # optional: the loop's CUDA device
     ...}                         # further optional keys for other kinds of samples

Timestamps are CLOCK_MONOTONIC nanoseconds (time.perf_counter_ns on Linux), the same
clock for every process on the node, so the agent can line up hook events with its
own samples.
"""
from __future__ import annotations

import json

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

    # One message as sent; a payload is the part a hook component adds to it.
    Message = dict[str, object]

VERSION = 1
MAX_MESSAGE_BYTES = 65536
MAX_EVENTS_PER_MESSAGE = 1000
DEFAULT_SOCKET = "/run/stallscope/hook.sock"


def encode(message: Mapping[str, object]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()
