"""links: the node's network links, each one's receive throughput against what it can
carry (issue 31, item 2: which link caps a bandwidth-bound job).

``/sys/class/net/<if>/statistics/rx_bytes`` and ``speed`` (Mb/s; kernel
Documentation/ABI/testing/sysfs-class-net and -statistics). Read: the physical
interfaces (those with a ``device`` link), never loopback, and the virtual ones that
``--exporter.links.include`` names: a pod's host-side veth or a bond, when they are
what carries the ranks' traffic. Only the agent's own network namespace is read (a
DaemonSet on the host network sees the node's), never a pod's.

Capacity: ``--exporter.links.capacity`` where the operator knows better than the link
speed (a cloud instance's bandwidth allowance is below its NIC's speed; a shaped link
carries its shaper's rate), else the link speed; a virtual device's nominal speed (a
veth says 10000 Mb/s) is no capacity. Without one the throughput is recorded and no
ratio is.

Correlator samples (node): ``link_receive_bytes_rate`` (the busiest interface's) and
``link_receive_ratio`` (the highest share of capacity) with that interface's capacity
``link_capacity_bytes_rate``, and ``/api/v1/links``: a row
per interface. ``stallscope_link_receive_ratio{interface}`` once per pod with ranks on
the node (a pod's cause query, diagnose without the agent, finds its node's links so);
node_exporter's ``node_network_receive_bytes_total`` and ``node_network_speed_bytes``
export the counters.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from ..host.contract import no_params
from ..host.families import family
from ..host.options import flag
from ..system.procfs import read_text
from ..vocabulary import labels, signal
from . import base

RECEIVE_RATE = signal("link_receive_bytes_rate").name
RECEIVE_RATIO = signal("link_receive_ratio").name
CAPACITY = signal("link_capacity_bytes_rate").name
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_capacities(text: str) -> dict[str, float]:
    """``IF=RATE[,IF=RATE]`` with RATE in bytes a second, or bits with a ``bit`` suffix
    (``eth0=12.5G,veth1=100Mbit``) -> {interface: bytes per second}; ValueError says
    what is wrong with the first bad entry."""
    out: dict[str, float] = {}
    for entry in filter(None, (e.strip() for e in (text or "").split(","))):
        name, _, rate = entry.partition("=")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgG]?)(bit)?", rate.strip())
        if not name.strip() or m is None or float(m.group(1)) <= 0:
            raise ValueError("not IF=RATE (bytes/s, or bits/s with a bit suffix, e.g. eth0=12.5G "
                             "or eth0=100Gbit): %r" % entry)
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
        out[name.strip()] = value / 8 if m.group(3) else value
    return out


@dataclasses.dataclass(frozen=True)
class LinksOptions:
    include: str = flag("", "--exporter.links.include",
                        "Virtual interfaces to read besides the physical ones (a pod's host-side "
                        "veth, a bond), when they carry the ranks' traffic.", metavar="REGEX", regex=True)
    capacity: str = flag("", "--exporter.links.capacity",
                         "What an interface can receive, where its link speed is not it (a cloud "
                         "bandwidth allowance, a shaped link): IF=RATE,... in bytes/s or with a bit "
                         "suffix (eth0=25Gbit).", metavar="LIST", check=parse_capacities)


class LinksExporter(base.Exporter):
    name = "links"
    Options = LinksOptions

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.rates = base.Rates(host)
        self.include = re.compile(self.options.include) if self.options.include else None
        self.capacity = parse_capacities(self.options.capacity)
        self.rows: list[dict[str, Any]] = []

    def _root(self) -> str:
        return os.path.join(self.host.sysfs, "class", "net")

    def unavailable(self) -> str | None:
        return None if os.path.isdir(self._root()) else "no %s" % self._root()

    def interfaces(self) -> list[tuple[str, bool]]:
        """(name, physical) of the interfaces read, in name order."""
        try:
            names = sorted(os.listdir(self._root()))
        except OSError:
            return []
        out = []
        for name in names:
            if name == "lo":
                continue
            physical = os.path.exists(os.path.join(self._root(), name, "device"))
            if physical or (self.include is not None and self.include.fullmatch(name)):
                out.append((name, physical))
        return out

    def _speed(self, name: str) -> float | None:
        """The link speed in bytes/s; None when down or unknown (the kernel reads -1)."""
        try:
            mbps = int(read_text(os.path.join(self._root(), name, "speed")) or "")
        except ValueError:
            return None
        return mbps * 1e6 / 8 if mbps > 0 else None

    def collect(self) -> Any:
        rows = []
        for name, physical in self.interfaces():
            try:
                rx = int(read_text(os.path.join(self._root(), name, "statistics", "rx_bytes")) or "")
            except ValueError:
                continue
            d = self.rates.delta(name, (float(rx),))
            if d is None:
                continue
            rate = d[1][0] / d[0]
            cap = self.capacity.get(name) or (self._speed(name) if physical else None)
            rows.append({"interface": name, "physical": physical, "receive_bytes_per_second": rate,
                         "capacity_bytes_per_second": cap,
                         "receive_ratio": rate / cap if cap else None})
        self.rates.prune()
        self.rows = rows
        ratio = family("stallscope_link_receive_ratio")
        if rows:
            self.record("node", RECEIVE_RATE, max(r["receive_bytes_per_second"] for r in rows))
            rated = [r for r in rows if r["receive_ratio"] is not None]
            if rated:
                busiest = max(rated, key=lambda r: r["receive_ratio"])
                self.record("node", RECEIVE_RATIO, busiest["receive_ratio"])
                self.record("node", CAPACITY, busiest["capacity_bytes_per_second"])
            pods = sorted({labels.values(labels.POD, r.labels) for r in self.host.ranks()})
            for pod in pods:
                for r in rows:
                    if r["receive_ratio"] is not None:
                        ratio.add_values(pod + (r["interface"],), r["receive_ratio"])
        return [ratio.family]

    def routes(self) -> dict[str, Any]:
        return {"/api/v1/links": self._route}

    def _route(self, query: Any) -> tuple[int, Any]:
        no_params(query)
        return 200, {"links": self.rows}
