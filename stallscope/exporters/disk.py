"""disk: the node's block devices: the write rate (the correlator's checkpoint-contention
signal), the read rate and how busy the busiest device is (how near a bandwidth-bound
job's reads are to what the device gives, issue 31).

/proc/diskstats (kernel Documentation/admin-guide/iostats.rst): after major, minor and
name, the 3rd field is sectors read and the 7th sectors written, in 512-byte units
whatever the device's sector size; the 10th the milliseconds with I/O in flight
(io_ticks: its rate is the device's utilisation, iostat's %util). Only whole physical
devices count (those with ``/sys/block/<dev>/device``): partitions, device-mapper, md,
loop and zram devices would count the same I/O again.

No metric family: node_exporter's ``node_disk_written_bytes_total``,
``node_disk_read_bytes_total`` and ``node_disk_io_time_seconds_total`` already export
the counters; this records the node samples ``disk_write_bytes_rate``,
``disk_read_bytes_rate`` (bytes/s) and ``disk_busy_ratio``.
"""
from __future__ import annotations

import os
from typing import Any

from ..system.procfs import read_text
from ..vocabulary import signal
from . import base

WRITE_RATE = signal("disk_write_bytes_rate").name
READ_RATE = signal("disk_read_bytes_rate").name
BUSY = signal("disk_busy_ratio").name

SECTOR = 512


def parse(text, physical):
    """(sectors read, sectors written, io_ticks ms) per device in ``physical``."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 13 and parts[2] in physical:
            try:
                out[parts[2]] = (int(parts[5]), int(parts[9]), int(parts[12]))
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
        devices = parse(read_text(os.path.join(self.host.procfs, "diskstats")), physical)
        d = self.rates.delta("node", (sum(r[0] for r in devices.values()),
                                      sum(r[1] for r in devices.values())))
        if d is not None:
            self.record("node", READ_RATE, d[1][0] * SECTOR / d[0])
            self.record("node", WRITE_RATE, d[1][1] * SECTOR / d[0])
        busy = []
        for name, (_, _, ticks) in devices.items():
            t = self.rates.delta(("ticks", name), (ticks,))
            if t is not None:
                busy.append(min(1.0, t[1][0] / 1000.0 / t[0]))
        if busy:
            self.record("node", BUSY, max(busy))
        self.rates.prune()
        return []
