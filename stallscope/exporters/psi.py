"""psi: pressure stall information of the node and of each rank's cgroup (v2).

Format (kernel Documentation/accounting/psi.rst): ``some avg10=.. avg60=.. avg300=..
total=<µs>`` and ``full ...``. ``total`` is exported as seconds counters with
node_exporter's names (some → waiting, full → stalled); consumers take rate(), not the
avg fields. System-wide cpu ``full`` is always 0; in a cgroup it is meaningful.

A rank's cgroup pressure comes from ``<v2 root>/<path>/{cpu,io,memory}.pressure``; on a
hybrid host whose processes sit at the v2 root (``0::/``) there is none beyond the
node's, and the rank's samples use the node's figures.
"""
from __future__ import annotations

import os
from typing import Any

from ..host.families import family
from ..system import cgroups
from ..system.procfs import read_text
from ..vocabulary import SIGNAL
from . import base

RESOURCES = ("cpu", "io", "memory")
KINDS = (("some", "waiting"), ("full", "stalled"))
# Samples for the correlator (rates of total µs / 1e6: the share of time stalled), for
# every (resource, kind) the vocabulary declares a signal of.
SIGNALS = {(res, kind): "psi_%s_%s_ratio" % (res, kind) for res in RESOURCES for kind, _ in KINDS
           if "psi_%s_%s_ratio" % (res, kind) in SIGNAL}


def parse(text):
    """A pressure file's text → {"some": total_seconds, "full": total_seconds}."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        for field in parts[1:]:
            if field.startswith("total="):
                try:
                    out[parts[0]] = int(field[6:]) / 1e6
                except ValueError:
                    pass
    return out


def read_dir(directory, suffix):
    """{(resource, kind): seconds} for ``<directory>/<resource><suffix>``."""
    out = {}
    for res in RESOURCES:
        for kind, v in parse(read_text(os.path.join(directory, res + suffix))).items():
            out[(res, kind)] = v
    return out


class PsiExporter(base.Exporter):
    name = "psi"

    def __init__(self, host: Any, options: Any = None) -> None:
        super().__init__(host, options)
        self.rates = base.Rates(host)

    def unavailable(self):
        if os.path.exists(os.path.join(self.host.procfs, "pressure", "cpu")):
            return None
        return ("no %s/pressure (a kernel without CONFIG_PSI, or CONFIG_PSI_DEFAULT_DISABLED "
                "without psi=1 on the kernel command line)" % self.host.procfs)

    def _ratios(self, key, readings):
        keys = sorted(readings)
        d = self.rates.delta(key, tuple(readings[k] for k in keys))
        if d is None:
            return {}
        dt, deltas = d
        return {k: v / dt for k, v in zip(keys, deltas)}

    def collect(self) -> Any:
        host = self.host
        fams = {(res, kind): family("stallscope_pressure_%s_%s_seconds_total" % (res, name))
                for res in RESOURCES for kind, name in KINDS}
        node = read_dir(os.path.join(host.procfs, "pressure"), "")
        for k, v in node.items():
            fams[k].add(self.node_labels, v)
        node_ratio = self._ratios("node", node)
        for k, v in node_ratio.items():
            if k in SIGNALS:
                self.record("node", SIGNALS[k], v)
        layout = cgroups.Layout(host.cgroupfs)
        done = {}
        for rank in host.ranks():
            ratio = node_ratio
            cg = rank.cgroup
            path = layout.resolve_v2(cg.v2) if cg is not None and layout.v2 else None
            if path in (None, "/"):
                self.note("no cgroup v2 pressure for the ranks' cgroups (%s): node PSI used"
                          % ("no cgroup v2 hierarchy" if not layout.v2 else "processes at the v2 root"))
            elif path in done:
                ratio = done[path]
            else:
                readings = read_dir(layout.v2_dir(path), ".pressure")
                if readings:
                    labels = dict(rank.labels, container=cgroups.container_label(cg, path))
                    for k, v in readings.items():
                        fams[k].add(labels, v)
                    ratio = done[path] = self._ratios(path, readings) or {}
            for k, v in ratio.items():
                if k in SIGNALS:
                    self.record(rank.key, SIGNALS[k], v)
        self.rates.prune()
        return [fams[k].family for k in sorted(fams)]
