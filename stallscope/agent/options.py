"""Flags of ``stallscope agent``, built from the typed options beside each part
(stallscope.host.options), so that cli.py only parses and dispatches. Root paths are
flags (as in node_exporter) so tests point them at fixtures and the DaemonSet at
/host/... mounts. Exporters are switched by ``--exporter.NAME/--no-exporter.NAME``, one
pair per registry line (unset means its default; set explicitly, "not available on this
node" becomes an error).
"""
from __future__ import annotations

from typing import Any, Callable

import click

from .. import exporters
from ..host.options import click_options, from_kwargs
from ..vocabulary import EXPORTERS
from .main import AgentOptions, Config
from .parts.correlator import CorrelatorOptions
from .parts.hangs import HangOptions


def _toggle(entry: Any) -> Callable[[Any], Any]:
    return click.option(
        "--exporter.%s/--no-exporter.%s" % (entry.name, entry.name), "exporter_" + entry.name,
        default=None, help="%s [default: %s]" % (entry.help, "on" if entry.default else "off"))


def _classes() -> list[Any]:
    return [AgentOptions] + [exporters.ExportersOptions] + exporters.option_classes() + [CorrelatorOptions,
                                                                                 HangOptions]


def add_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    decorators = click_options(AgentOptions) + [_toggle(e) for e in EXPORTERS]
    for cls in _classes()[1:]:
        decorators += click_options(cls)
    for option in reversed(decorators):
        fn = option(fn)
    return fn


def config_from(kwargs: dict[str, Any]) -> Config:
    enabled = {e.name: kwargs.pop("exporter_" + e.name) for e in EXPORTERS}
    parts = {cls: from_kwargs(cls, kwargs) for cls in exporters.option_classes()}
    config = Config(agent=from_kwargs(AgentOptions, kwargs),
                    exporters=from_kwargs(exporters.ExportersOptions, kwargs), enabled=enabled,
                    correlator=from_kwargs(CorrelatorOptions, kwargs),
                    hangs=from_kwargs(HangOptions, kwargs), parts=parts)
    if kwargs:
        raise TypeError("unknown agent options: %s" % ", ".join(sorted(kwargs)))
    return config
