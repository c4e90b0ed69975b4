"""Who may report as a pod name that no pod map vouches for: outside Kubernetes, or while
the API server cannot be had (issue 33; threat model: docs/deploy.md).

The order, for a report whose sender the kernel names (peer.py):
1. The pod map vouches (kubepods.py current, the sender's pod UID is that name's): the
   cluster's word wins, and the name is bound to that pod from now on.
2. The allow-list (allowlist.py) lists the name: only a sender matching one of its
   entries (uid, cgroup) may report as it, else ``not_allowed``; no binding is kept.
3. Otherwise the name belongs to its first claimant's domain (its pod, or its cgroup
   and uid) for the agent's life, not only while its ranks live (state.py): another
   domain's report is an ``identity_mismatch``.

A binding is released when the claimant is gone by the kernel's record: one of the
cgroups its process was in when it claimed the name no longer exists under
``--path.cgroupfs``. A cgroup cannot be removed while a process is in it, and only
root (or whoever it is delegated to) removes one, so a neighbour cannot free another's
name, while a finished Slurm job (slurmstepd removes ``job_N``) or systemd scope frees
the hostname the hook reports by default for the next job on the node. A cgroup still
there keeps the name bound, however long ago its trainer exited. An allow-list entry
for the name and a restart of the agent release it too.

Memory: at most ``MAX_BINDINGS`` bindings and ``MAX_BINDING_BYTES``; past that the
oldest binding of the uid holding the most is evicted (and counted), so one user that
claims name after name (from as many cgroups as it can make) evicts its own bindings,
not its neighbours'.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import threading
from typing import Any

from ...system import cgroups
from . import kubepods, peer
from .allowlist import AllowList, Name
from .refusal import Refused

MAX_BINDINGS = 4096
# Their bytes are bounded too, as counted by ``cost`` (a sender may sit in a cgroup with a
# long path: a user's delegated systemd subtree); measured against tracemalloc in
# tests/agent/test_name_binding.py.
MAX_BINDING_BYTES = 8 << 20
BINDING_OVERHEAD = 700    # the key and domain tuples, the Binding, dict and count slots
V1_ENTRY_OVERHEAD = 120   # a (controller, path) pair of a v1 hierarchy


def cost(name: Name, source: peer.Source) -> int:
    return (BINDING_OVERHEAD + len(name[0]) + len(name[1]) + 2 * len(source.cgroup)
            + sum(V1_ENTRY_OVERHEAD + len(c) + len(p) for c, p in _own_v1(source)))


def _own_v1(source: peer.Source) -> tuple[tuple[str, str], ...]:
    """The v1 paths worth keeping: not the root (never removed)."""
    return tuple((c, p) for c, p in source.v1 if p.strip("/"))


@dataclasses.dataclass(frozen=True)
class Binding:
    domain: peer.Domain
    uid: int
    cgroup: str                          # the v2 path (else v1 cpu), as in the domain
    v1: tuple[tuple[str, str], ...]      # (controller, path) when it claimed the name
    bytes: int                           # cost(): what it counts against MAX_BINDING_BYTES


class Names:
    """The bindings and the rule above; thread-safe (the ingest applies, the scheduler
    reloads the allow-list)."""

    def __init__(self, cgroupfs: str = "/sys/fs/cgroup", pods: kubepods.PodMap | None = None,
                 allow: AllowList | None = None, max_bindings: int = MAX_BINDINGS) -> None:
        self.layout: Any = cgroups.Layout(cgroupfs)  # type: ignore[no-untyped-call]
        self.pods = pods              # the API server's word, where there is one
        self.allow = allow or AllowList()
        self.max_bindings = max_bindings
        self.bindings: collections.OrderedDict[Name, Binding] = collections.OrderedDict()
        self.per_uid: collections.Counter[int] = collections.Counter()  # whose bindings they are
        self.bytes = 0
        self.evicted = 0
        self.released = 0            # by a claimant's cgroup found gone
        self.lock = threading.Lock()

    def rule(self, name: Name, source: peer.Source) -> str:
        """Which rule judges ``source`` claiming ``name``: "pod_map" or "allow_list" (the
        claim is good; raises Refused("not_allowed") when the list refuses it), or
        "binding" (the caller checks the live ranks' domain, then ``check``)."""
        if self._vouched(name, source):
            return "pod_map"
        entries = self.allow.get(name)
        if entries is None:
            return "binding"
        if not any(e.admits(source) for e in entries):
            raise Refused("not_allowed")
        return "allow_list"

    def _vouched(self, name: Name, source: peer.Source) -> bool:
        pods = self.pods
        if pods is None or source.pod_uid is None or not pods.current:
            return False
        with pods.lock:
            return pods.names.get(name) == source.pod_uid

    def check(self, name: Name, source: peer.Source) -> None:
        """Raise Refused when ``name`` is bound to another domain whose claimant is not
        known gone; a gone claimant's binding is released."""
        with self.lock:
            bound = self.bindings.get(name)
            if bound is None or bound.domain == source.domain:
                return
            if not self.gone(bound.cgroup, bound.v1):
                raise Refused()
            self._drop(name)
            self.released += 1

    def bind(self, name: Name, source: peer.Source, rule: str) -> None:
        """``source`` made a rank under ``name`` by ``rule``: bind it unless the allow-list
        judges the name; the pod map's word replaces any binding."""
        if rule == "allow_list":
            return
        with self.lock:
            bound = self.bindings.get(name)
            if bound is not None and (bound.domain == source.domain or rule != "pod_map"):
                return
            if bound is not None:
                self._drop(name)
            size = cost(name, source)
            while self.bindings and (len(self.bindings) >= self.max_bindings or
                                     self.bytes + size > MAX_BINDING_BYTES):
                self._evict()
            self.bindings[name] = Binding(source.domain, source.uid, source.cgroup,
                                          _own_v1(source), size)
            self.per_uid[source.uid] += 1
            self.bytes += size

    def _drop(self, name: Name) -> None:
        b = self.bindings.pop(name)
        self.bytes -= b.bytes
        self.per_uid[b.uid] -= 1
        if self.per_uid[b.uid] <= 0:
            del self.per_uid[b.uid]

    def _evict(self) -> None:
        heavy = max(self.per_uid.items(), key=lambda kv: kv[1])[0]
        oldest = next(n for n, b in self.bindings.items() if b.uid == heavy)
        self._drop(oldest)
        self.evicted += 1

    def poll(self) -> None:
        """The scheduler's: reload the allow-list when asked or changed (allowlist.py)."""
        if self.allow.poll():
            self.forget_listed()

    def forget_listed(self) -> None:
        """After an allow-list (re)load: bindings of listed names are released."""
        with self.lock:
            for name in [n for n in self.bindings if self.allow.get(n) is not None]:
                self._drop(name)

    def gone(self, v2_path: str, v1: tuple[tuple[str, str], ...]) -> bool:
        """Whether one of a claimant's cgroups no longer exists (never for the root, nor
        for a hierarchy the agent cannot see or a path seen through another cgroup
        namespace: then the binding stands)."""
        layout = self.layout
        places = [(layout.v2, v2_path)]
        for controller, path in v1:
            controller = controller[len("name="):] if controller.startswith("name=") else controller
            places.append((layout.v1.get(controller), path))
        for base, path in places:
            if base is None or not path.strip("/"):
                continue
            if "/.." in path:
                continue  # seen through a cgroup namespace: its host path is not known for sure
            if not os.path.isdir(os.path.join(base, path.lstrip("/"))):
                return True
        return False

    def __len__(self) -> int:
        return len(self.bindings)
