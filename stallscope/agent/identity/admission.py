"""Identity as its own step before the fold: ``admit(report, sender, ...)`` says whether
the sender may speak for the rank and the pod name its report claims, and returns an
``Admission`` the rank table folds; or it raises ``Refused`` with a short reason the
agent counts. Nothing of the report's own word is trusted: the sender is what the kernel
named (peer.py), the pod name what the pod map or the allow-list vouches for, else the
first domain that claimed it (names.py).

The order, for a sender the kernel names (``sender`` None: an in-process caller, whose
report is taken at its word):

1. The name: the pod map vouches, the allow-list pins, or it is bound to the domain
   that first claimed it while any of its ranks lives (or, beyond that, until its
   claimant's cgroup is gone: names.py). A name whose live holder has departed by the
   kernel's record passes to the new sender (``takes_name``).
2. The rank: a live rank takes reports only from its own domain; its trainer's reports
   from any process of that domain (a restart), a worker's only from a process seen to
   descend from the trainer (``verified``: its PID and start time, remembered).
3. A worker's report for a rank its trainer has not made yet is ``unknown_rank`` (the
   agent holds it for a while: table/held.py).

``admit`` changes nothing in the table (names.py may release a binding whose claimant
it finds gone); the table applies what an Admission says under the same lock, so
nothing moves between the two steps.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

from ...host.report import HookReport
from . import names, peer
from .allowlist import Name
from .refusal import Refused

RankKey = tuple[str, str, str, int]

__all__ = ["Admission", "Refused", "admit"]


class Claimed(Protocol):
    """What admission reads of a rank already in the table."""

    @property
    def domain(self) -> peer.Domain | None: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def pid_start(self) -> int | None: ...


class Holders(Protocol):
    """What admission asks the table about a pod name: which domain holds it while its
    ranks live, and whether that domain is gone by the kernel's record."""

    def holder(self, name: Name) -> peer.Domain | None: ...

    def departed(self, name: Name, domain: peer.Domain) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Admission:
    """A report admitted: for which rank, from whom, and what the table must record."""

    key: RankKey
    main: bool                    # the trainer's report (else a loader worker's)
    pid: int                      # the sender in the agent's PID namespace
    source: peer.Source | None    # None: an in-process caller (tests, benchmarks)
    rule: str = ""                # which rule judged the pod name (names.py), "" in-process
    takes_name: bool = False      # the name passes from a departed holder to this sender
    verified: tuple[int, int | None] | None = None  # a worker seen to descend: (pid, start)

    @property
    def domain(self) -> peer.Domain | None:
        return self.source.domain if self.source is not None else None

    @property
    def uid(self) -> int | None:
        return self.source.uid if self.source is not None else None


def admit(report: HookReport, sender: peer.Source | None, rank: Claimed | None,
          bindings: names.Names, holders: Holders) -> Admission:
    """Admit ``report`` from ``sender`` for ``rank`` (the table's, None when the rank
    is new), or raise Refused."""
    key = report.key
    main = report.main
    if sender is None:
        if rank is None and not main:
            raise Refused("unknown_rank")
        return Admission(key, main, report.pid, None)
    name = (key[0], key[1])
    rule = bindings.rule(name, sender)  # raises not_allowed
    takes_name = False
    if rule == "binding":
        held = holders.holder(name)
        if held is not None and held != sender.domain:
            if not holders.departed(name, held):
                raise Refused()  # the pod name is another domain's while its ranks live
            takes_name = True
        bindings.check(name, sender)
    verified = _rank(rank, sender, main)
    if rank is None and not main:
        raise Refused("unknown_rank")  # a worker speaks only for a rank its trainer made
    return Admission(key, main, sender.pid, sender, rule, takes_name, verified)


def _rank(rank: Claimed | None, sender: peer.Source,
          main: bool) -> tuple[int, int | None] | None:
    if rank is None:
        return None
    if rank.domain is not None and rank.domain != sender.domain:
        raise Refused()
    if main:
        return None  # its own process, or a restart of it in the same domain
    if rank.pid is None:
        raise Refused("unknown_rank")
    if sender.pid == rank.pid:
        return None  # num_workers=0: the trainer times its own fetches (hook/batches.py)
    if not peer.descends_from(sender, rank.pid, rank.pid_start):
        raise Refused()  # a loader worker descends from its trainer
    return (sender.pid, sender.start)
