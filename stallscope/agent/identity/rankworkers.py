"""A rank's loader workers as the agent's PID namespace numbers them, and only those.

A trainer reports its workers' PIDs as its own PID namespace numbers them (pids.py maps
them through its children); a worker's own report gives its PID in the agent's
namespace (SO_PEERCRED), which maps the reported PID even when the worker is not the
trainer's child (forkserver, spawn). Only PIDs seen to descend from the trainer are kept:
a report naming another process (PID 1, a neighbour's) must not make the agent read it.
The rank table (table/state.py) calls these under its lock, on the fields of a rank's
state named by ``Workers`` (this room knows no rank table).
"""
from __future__ import annotations

import collections
from typing import Any, Protocol

from ...system import procfs
from . import peer

MAX_PID_MAP = 256
MAX_VERIFIED = 256


class Workers(Protocol):
    """The fields of a rank's state (table/rankstate.py) that say who its workers are."""

    pid: int | None                          # its trainer, in the agent's PID namespace
    domain: peer.Domain | None
    reported_workers: list[int]              # as the trainer reported them
    translated_workers: list[int]            # the same, mapped through its children
    worker_pids: list[int]                   # the same, in the agent's PID namespace
    worker_map: collections.OrderedDict[int, int]  # reported -> host PID, by their own reports
    verified: dict[int, int]                 # worker PID -> starttime, seen to descend
    exits_reported: collections.deque[tuple[int, int]]


def note_exits(rank: Workers, exits: Any) -> None:
    """Deaths by signal the trainer reported, for PIDs this very report names as its
    workers, mapped into the agent's PID namespace; a stream repeats them in every
    report until it ends, so each is queued once."""
    hosts = dict(zip(rank.reported_workers, rank.translated_workers))
    for pid, code in exits:
        if code < 0 and pid in hosts:
            death = (rank.worker_map.get(pid, hosts[pid]), code)
            if death not in rank.exits_reported:
                rank.exits_reported.append(death)


def note_worker(root: str, rank: Workers, reported: int, host: int) -> int:
    """A loader worker's report: its PID as the trainer numbers it (``reported``) and as
    the kernel named the sender (``host``). Returns the PIDs refused (not the trainer's)."""
    if not host or host == rank.pid:
        return 0  # num_workers=0: the trainer itself produces the batches
    if rank.worker_map.get(reported) != host:
        rank.worker_map[reported] = host
        while len(rank.worker_map) > MAX_PID_MAP:
            rank.worker_map.popitem(last=False)
        return map_workers(root, rank)
    rank.worker_map.move_to_end(reported)
    return 0


def map_workers(root: str, rank: Workers) -> int:
    """Set ``rank.worker_pids`` from what the trainer and its workers reported; returns
    how many reported PIDs were refused as not descending from the trainer."""
    refused = 0
    mapped = [rank.worker_map.get(p, h) for p, h in zip(rank.reported_workers, rank.translated_workers)]
    if rank.domain is not None and rank.pid is not None:
        kept = []
        for p in mapped:
            ours = descends(root, rank, p)
            if ours:
                kept.append(p)
            elif ours is False:
                refused += 1
        mapped = kept
    if mapped != rank.worker_pids:
        rank.worker_pids = mapped
    return refused


def descends(root: str, rank: Workers, pid: int) -> bool | None:
    """True: a worker of the rank (seen to descend, now or when its report came);
    False: another process; None: gone, never seen (nothing to read, nothing refused)."""
    start = procfs.start_time(root, pid)
    known = rank.verified.get(pid)
    if known is not None and (start is None or start == known):
        return True
    if start is None:
        return None
    if rank.pid is None or not peer.descends(root, pid, rank.pid):
        return False
    verify(rank, pid, start)
    return True


def verify(rank: Workers, pid: int, start: int | None) -> None:
    """Remember ``pid`` (at ``start``) as seen to descend from the rank's trainer."""
    if start is None:
        return
    if pid not in rank.verified and len(rank.verified) >= MAX_VERIFIED:
        rank.verified.pop(next(iter(rank.verified)))
    rank.verified[pid] = start
