"""Node exporters: one module per node signal (cfs, psi, shm, fuse, workers, gpu ...),
registered in the vocabulary (stallscope/vocabulary/node.py), run by runner.py off the
scrape path, attributed to ranks through their PIDs' cgroups (stallscope/system/).
Each is a part (stallscope.host.Part); the agent's composition root builds them with
``build``.
"""
from __future__ import annotations

from typing import Any

from . import registry
from .base import Exporter
from .runner import ExportersOptions, Runner

__all__ = ["Exporter", "ExportersOptions", "Runner", "build", "option_classes", "registry"]

# build()'s default; ExportersOptions is frozen, so one instance serves every call.
_DEFAULT_RUNNER_OPTIONS = ExportersOptions()


def option_classes() -> list[Any]:
    """The Options dataclass of every registered exporter that has flags."""
    out = []
    for entry in registry.EXPORTERS:
        cls = registry.load(entry)
        if cls.Options is not None:
            out.append(cls.Options)
    return out


def build(host: Any, enabled: dict[str, bool | None], options: dict[type, Any],
          runner_options: ExportersOptions = _DEFAULT_RUNNER_OPTIONS) -> tuple[list[Exporter], Runner]:
    """The exporters that ``enabled`` turns on ({name: True/False/None=default}), each
    with its options from ``options`` ({Options class: instance}, else its defaults),
    and the Runner that schedules them."""
    chosen = []
    for entry in registry.chosen(enabled):
        cls = registry.load(entry)
        opts = options.get(cls.Options) if cls.Options is not None else None
        chosen.append((cls(host, opts), enabled.get(entry.name) is True))
    return [e for e, _ in chosen], Runner(host, chosen, runner_options)
