"""The agent's memory ceiling, from ``--max-ranks`` and ``--timeline-seconds``.

Every per-rank history is a fixed-capacity ring (host/rings.py) sized here, so the bytes the
agent can hold for its ranks are known before the first report arrives: the agent prints
the figure at start, and the DaemonSet's memory limit is set from it (docs/deploy.md).

Rates behind the capacities: a rank's batch timeline and its per-batch signals keep
``timeline_seconds x BATCHES_PER_S`` entries (a faster loop keeps a shorter history, not
more memory); GPU signals ``x GPU_SAMPLES_PER_S``; exporter signals one per second (they
are collected every 2 s by default).
"""
from __future__ import annotations

import dataclasses

from ... import vocabulary
from ...correlate.waitbins import WaitBins
from ..identity.names import MAX_BINDING_BYTES, MAX_BINDINGS
from .held import MAX_HELD_BYTES

BATCHES_PER_S = 20.0
GPU_SAMPLES_PER_S = 10.0
COLLECTIONS_PER_S = 1.0
EVENT_BYTES = 32          # (t_end, wait, interval, ready_wait) int64
POINT_BYTES = 16          # (t, value) int64 + float64
SHARD_READS_PER_TIER = 4096   # the window for a tier's read-latency quantiles
TIERS_PER_POD = 8
GPU_RING = 4096           # a GPU's (t, period, ratio) samples kept for the timeline API
GPU_SAMPLE_BYTES = 24     # (exporters/gpu/source.py: RING_SIZE, SAMPLE_BYTES)
GPU_SCOPES = 64           # a node's GPUs (8) and MIG instances (7 each), and "node"
# The correlator copies a window (up to the whole history) of the ranks it analyses at
# once; the HTTP server and prometheus_client build /metrics per scrape.
ANALYSIS_FACTOR = 1.5
BASELINE_MIB = 92         # interpreter, numpy, prometheus_client, threads (measured idle RSS, 80),
                          # and the health responder's process (healthd.py: 12 MiB)


@dataclasses.dataclass(frozen=True)
class Budget:
    max_ranks: int
    timeline_seconds: float

    def capacity(self, cadence: str) -> int:
        rate = {"batch": BATCHES_PER_S, "gpu": GPU_SAMPLES_PER_S, "collection": COLLECTIONS_PER_S}[cadence]
        return max(16, int(self.timeline_seconds * rate))

    @property
    def events(self) -> int:
        return self.capacity("batch")

    def signal_capacity(self, name: str) -> int:
        return self.capacity(vocabulary.signal(name).cadence)

    @property
    def max_scopes(self) -> int:
        """Scopes the sample store keeps at most (samples.py): each rank's own and its
        simulated GPU's (what rank_bytes counts), and the node's GPUs and MIG instances;
        a new one past that evicts the stalest, a departed rank's."""
        return 2 * self.max_ranks + GPU_SCOPES

    def rank_bytes(self) -> int:
        """History of one rank: its batch timeline and every rank-scoped signal, with the
        simulated GPU's scope when there is one, and its pod's shard-read windows."""
        signals = sum(self.capacity(s.cadence) for s in vocabulary.SIGNALS if "rank" in s.scopes)
        gpu = sum(self.capacity(s.cadence) for s in vocabulary.SIGNALS if "gpu" in s.scopes)
        shards = SHARD_READS_PER_TIER * TIERS_PER_POD * 16
        return (self.events * EVENT_BYTES + (signals + gpu) * POINT_BYTES + shards
                + GPU_RING * GPU_SAMPLE_BYTES + WaitBins().nbytes)

    def node_bytes(self) -> int:
        return sum(self.capacity(s.cadence) for s in vocabulary.SIGNALS if "node" in s.scopes) * POINT_BYTES

    def history_bytes(self) -> int:
        return int((self.max_ranks * self.rank_bytes() + self.node_bytes()) * ANALYSIS_FACTOR)

    def held_bytes(self) -> int:
        """What senders can make the agent keep besides ranks: workers' reports held for
        a trainer that has not reported yet (held.py, bounded in total and per sender)."""
        return MAX_HELD_BYTES

    def bindings_bytes(self) -> int:
        """Pod names bound to their claimants beyond their ranks' lives (names.py: at
        most MAX_BINDINGS and MAX_BINDING_BYTES, the oldest of the domain holding the most
        evicted past that)."""
        return MAX_BINDING_BYTES

    def limit_mib(self) -> int:
        """What a memory limit must allow: the history's ceiling, the held reports and
        the baseline."""
        return int((self.history_bytes() + self.held_bytes() + self.bindings_bytes()) / 2**20) + BASELINE_MIB

    def describe(self) -> str:
        return ("memory ceiling: %d MiB of history (%d ranks x %.0f KiB, %.0f s timelines, %d "
                "batches each), %d MiB of held reports, %d MiB of name bindings (%d names at most), "
                "plus ~%d MiB baseline: set the memory limit to at least %d MiB"
                % (self.history_bytes() / 2**20, self.max_ranks, self.rank_bytes() / 1024,
                   self.timeline_seconds, self.events, self.held_bytes() / 2**20,
                   self.bindings_bytes() / 2**20, MAX_BINDINGS, BASELINE_MIB, self.limit_mib()))
