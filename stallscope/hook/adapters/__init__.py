"""Adapters that record shard reads and cache lookups of data-loading libraries.

Each adapter patches one library, in the process that runs it, when ``watch()`` starts
an iterator and in each loader worker as it starts, and only if that library is
already imported (so ``import stallscope`` never imports it, and a library that is not
installed costs nothing). ``STALLSCOPE_ADAPTERS`` chooses: ``auto`` (default: all),
``none``, or a comma list such as ``fsspec``. See docs/adapters.md to add one.
"""
from __future__ import annotations

import importlib
import os
import sys

# (name, module that must be imported for the adapter to apply)
ADAPTERS = (("webdataset", "webdataset"), ("fsspec", "fsspec"), ("streaming", "streaming"),
            ("urllib3", "urllib3.connectionpool"))
MODULES = {"urllib3": "urllib3pool"}  # an adapter module named apart from the library it adapts
enabled: set[str] = set()


def wanted() -> set[str]:
    setting = os.environ.get("STALLSCOPE_ADAPTERS", "auto").strip().lower()
    if setting == "auto":
        return {name for name, _ in ADAPTERS}
    if setting in ("", "none", "0", "off"):
        return set()
    return {s.strip() for s in setting.split(",")}


def enable() -> None:
    """Install every wanted adapter whose library is imported. Never raises."""
    try:
        names = wanted()
    except Exception:
        return
    for name, module in ADAPTERS:
        if name in names and name not in enabled and module in sys.modules:
            try:
                importlib.import_module("." + MODULES.get(name, name), __name__).install()
                enabled.add(name)
            except Exception:
                enabled.add(name)  # an adapter that does not fit this version stays off
