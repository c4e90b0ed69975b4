"""disk: the node's block-device write rate, the correlator's checkpoint-contention signal.

/proc/diskstats (kernel Documentation/admin-guide/iostats.rst): after major, minor and
name, the 7th field is sectors written, in 512-byte units whatever the device's sector
size. Only whole physical devices count (those with ``/sys/block/<dev>/device``):
partitions, device-mapper, md, loop and zram devices would count the same write again.

No metric family: node_exporter's ``node_disk_written_bytes_total`` already exports
the counters; this only records the node sample ``disk_write_bytes_rate`` (bytes/s).
"""
from __future__ import annotations

import os
from typing import Any

from ..system.procfs import read_text
from ..vocabulary import signal
from . import base

WRITE_RATE = signal("disk_write_bytes_rate").name

SECTOR = 512


def parse(text, physical):
    """Sectors written per device in ``physical`` from diskstats text: {name: sectors}."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 10 and parts[2] in physical:
            try:
                out[parts[2]] = int(parts[9])
            except ValueError:
                pass
    return out


class DiskExporter(base.Exporter):
    name = "disk"

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.rates = base.Rates(host)

    def _physical(self):
        root = os.path.join(self.host.sysfs, "block")
        try:
            names = os.listdir(root)
        except OSError:
            return set()
        return {n for n in names if os.path.exists(os.path.join(root, n, "device"))}

    def unavailable(self):
        if not os.path.exists(os.path.join(self.host.procfs, "diskstats")):
            return "no %s/diskstats" % self.host.procfs
        return None

    def collect(self) -> Any:
        physical = self._physical()
        if not physical:
            self.note("no physical block devices under %s/block" % self.host.sysfs)
            return []
        written = parse(read_text(os.path.join(self.host.procfs, "diskstats")), physical)
        d = self.rates.delta("node", (sum(written.values()),))
        if d is not None:
            self.record("node", WRITE_RATE, d[1][0] * SECTOR / d[0])
        self.rates.prune()
        return []
