"""Fault injectors: each breaks one rank's input pipeline the way production breaks it.

A fault checks what it needs (``missing()``: one line, or None), creates what it needs
before the ranks start (``prepare``), may wrap the target rank's command (``setup_lines``,
``enter``), and may act while the job runs (``tick``). Every resource is registered with
the run's Teardown *before* it is created, so an interrupt between the two still undoes
it. ``run`` is the job (lab/job.py): its plans, target rank, work directory, ``spawn``.

- CpuQuota         the target's loader workers join a cgroup with a tight CFS quota
- CpuHogs          busy processes crowd the CPU the target's loader workers run on
- SlowFuse         the target reads its shards through FUSE with injected latency
- DeadFuse         ... and the FUSE daemon is SIGKILLed mid-run (reads fail with ENOTCONN)
- NodeWriter       a process outside the pods writes to the node's disk all along (a backdrop)
- DiskCheckpoints  a process outside the pods writes checkpoint bursts to the node's disk
- LocalCache       the target looks shards up in a local cache that holds few of them
- ColdCache        every rank reads through a cache in front of a slow object store; the
                   target's is cold
- RemoteShards     the target reads every sample from a distant object store (no cache)
- CheckpointBurst  checkpoint uploads saturate the storage server the target reads from
- ShapedStore      the target reads every sample from an object store behind a link that
                   a tc token bucket shapes (a network namespace and a veth pair)
- TinyShm          the target runs in its own mount namespace with a tiny /dev/shm
- ShmBusError      ... mostly full, and its workers fill the rest until one dies of SIGBUS
- NodeShm          the target's lab node has a tiny /dev/shm that all its ranks share
- MemoryLimit      the target runs under a memory limit its workers outgrow (OOM kills)
- Combined         several of these on the same rank at once
"""
from .base import Combined, Fault, NoFault, available
from .cpu import CpuHogs, CpuQuota
from .memory import MemoryLimit
from .network import ShapedStore
from .shm import NodeShm, ShmBusError, TinyShm
from .storage import (
    CheckpointBurst,
    ColdCache,
    DeadFuse,
    DiskCheckpoints,
    FrozenFuse,
    LocalCache,
    NodeWriter,
    RemoteShards,
    SlowFuse,
    http_up,
    start_objstore,
)

__all__ = ["CheckpointBurst", "ColdCache", "Combined", "CpuHogs", "CpuQuota", "DeadFuse",
           "DiskCheckpoints", "Fault", "FrozenFuse", "LocalCache", "MemoryLimit", "NoFault",
           "NodeShm", "NodeWriter", "RemoteShards", "ShapedStore", "ShmBusError", "SlowFuse",
           "TinyShm", "available", "http_up", "start_objstore"]
