"""The exporters the agent knows: the vocabulary's registry (stallscope/vocabulary/node.py,
one line each, like node_exporter's collectors), and what builds them. Modules are
imported when their exporter's class is asked for."""
from __future__ import annotations

import importlib
from typing import Any

from ..vocabulary import EXPORTERS
from ..vocabulary.entries import Exporter as Entry


def load(entry: Entry) -> Any:
    """The exporter class of ``entry`` (imported on first use)."""
    module, _, cls = entry.target.partition(":")
    return getattr(importlib.import_module("stallscope.exporters." + module), cls)


def chosen(enabled: dict[str, bool | None]) -> list[Entry]:
    """The entries that ``enabled`` ({name: True/False/None=default}) turns on."""
    return [e for e in EXPORTERS if enabled.get(e.name) is not False
            and (enabled.get(e.name) is True or e.default)]
