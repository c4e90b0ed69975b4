"""iolimit: the bytes a second each rank's cgroup may read from a block device.

cgroup v1 ``blkio.throttle.read_bps_device`` ("MAJ:MIN BYTES" a line) and v2 ``io.max``
("MAJ:MIN rbps=BYTES wbps=... riops=... wiops=...", ``max`` for none), kernel
Documentation/admin-guide/cgroup-v1/blkio-controller.rst and cgroup-v2.rst (IO). A
parent's limit throttles its children too, so a rank's limit is the tightest read limit
along its cgroup's ancestors, over every device (the workers read their shards from
one). It is the ``device`` capacity of the correlator's predictions (correlate/
capacity.py, issue 49): under a bytes-a-second cap, more workers share the same bytes.

Published as a ``RankIoLimit`` fact (None: no limit); no metric family (the per-rank
series budget is tight) and nothing read but the rank's own cgroup files.
"""
from __future__ import annotations

import os
from typing import Any

from ..host.facts import RankIoLimit
from ..system import cgroups
from ..system.procfs import read_text
from . import base


def parse_v1(text: str | None) -> float | None:
    """The tightest read limit of a v1 ``blkio.throttle.read_bps_device``, or None."""
    found = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and int(parts[1]) > 0:
            found.append(float(parts[1]))
    return min(found) if found else None


def parse_v2(text: str | None) -> float | None:
    """The tightest ``rbps`` of a v2 ``io.max``, or None (``max`` is no limit)."""
    found = []
    for line in (text or "").splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if key == "rbps" and value.isdigit() and int(value) > 0:
                found.append(float(value))
    return min(found) if found else None


class IoLimitExporter(base.Exporter):
    name = "iolimit"

    def unavailable(self):
        layout = self.cgroup_layout()
        if "blkio" in layout.v1:
            return None
        controllers = read_text(os.path.join(layout.v2 or "/nonexistent", "cgroup.controllers"))
        if controllers is not None and "io" in controllers.split():
            return None
        return "no blkio/io cgroup controller under %s" % self.host.cgroupfs

    def _limit(self, layout: Any, cg: Any, cache: dict[tuple[int, str], float | None]) -> float | None:
        """The tightest read limit along the cgroup's ancestors (v1 blkio, else v2 io)."""
        if "blkio" in layout.v1 and "blkio" in cg.v1:
            version, path = 1, layout.resolve_v1("blkio", cg.v1["blkio"])
        elif layout.v2 and cg.v2 is not None:
            version, path = 2, layout.resolve_v2(cg.v2)
        else:
            return None
        if not path or path == "/":
            return None
        best = None
        for p in cgroups.ancestors(path):
            if (version, p) not in cache:
                if version == 1:
                    cache[(version, p)] = parse_v1(read_text(os.path.join(
                        layout.v1_dir("blkio", p), "blkio.throttle.read_bps_device")))
                else:
                    cache[(version, p)] = parse_v2(read_text(os.path.join(layout.v2_dir(p), "io.max")))
            limit = cache[(version, p)]
            if limit is not None and (best is None or limit < best):
                best = limit
        return best

    def collect(self) -> Any:
        layout = self.cgroup_layout()
        cache: dict[tuple[int, str], float | None] = {}
        for rank in self.host.ranks():
            if rank.cgroup is None:
                continue
            self.host.facts.publish(self.name, rank.key, RankIoLimit(self._limit(layout, rank.cgroup, cache)))
        return []
