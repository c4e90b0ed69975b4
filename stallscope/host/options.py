"""Typed options beside each part, and the flags they become.

A part declares its settings as a frozen dataclass whose fields carry their flag::

    @dataclasses.dataclass(frozen=True)
    class FuseOptions:
        probe_timeout: float = flag(2.0, "--exporter.fuse.probe-timeout", "...", lo=0.05)

The default is written once, here; ``stallscope agent`` gets the flag from it
(``click_options``) and the part gets the dataclass back (``from_kwargs``). Tests build
the dataclass directly. Only ``click_options`` needs click.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def flag(default: Any, name: str, help: str, *, lo: float | None = None,
         hi: float | None = None, metavar: str | None = None, envvar: str | None = None,
         kind: type | None = None, regex: bool = False, url: bool = False,
         hidden: bool = False, check: Callable[[Any], Any] | None = None) -> Any:
    """A dataclass field that is also a command-line flag (``name``; ``--a/--no-a`` for a
    switch). ``lo``/``hi`` bound numbers; ``regex``/``url`` check strings; ``kind`` gives
    the type where the default (None) cannot; ``check`` raises ValueError (its message
    the one line the user sees) for a value of the right type that means nothing."""
    meta = {"flag": name, "help": help, "lo": lo, "hi": hi, "metavar": metavar,
            "envvar": envvar, "kind": kind or type(default), "regex": regex, "url": url,
            "hidden": hidden, "check": check}
    return dataclasses.field(default=default, metadata={"stallscope": meta})


def _dest(cls: type, field: dataclasses.Field) -> str:  # type: ignore[type-arg]
    return "%s__%s" % (cls.__name__.lower(), field.name)


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError("not a regular expression: %s" % e) from None
    return value


def _check_url(value: str) -> str:
    if value and not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL, e.g. http://localhost:9400/metrics")
    return value


def checks(meta: dict[str, Any]) -> list[Callable[[Any], Any]]:
    out: list[Callable[[Any], Any]] = []
    if meta["regex"]:
        out.append(_check_regex)
    if meta["url"]:
        out.append(_check_url)
    check = meta.get("check")
    if check is not None:
        def checked(value: Any) -> Any:
            check(value)  # raises ValueError; the value itself is what the option holds
            return value
        out.append(checked)
    return out


def click_options(cls: type) -> list[Callable[[Any], Any]]:
    """click.option decorators for every flag field of the dataclass ``cls``."""
    import click

    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("stallscope")
        if meta is None:
            continue
        kind = meta["kind"]
        kw: dict[str, Any] = {"default": f.default, "help": meta["help"], "hidden": meta["hidden"]}
        if meta["envvar"]:
            kw["envvar"] = meta["envvar"]
        if meta["metavar"]:
            kw["metavar"] = meta["metavar"]
        if kind is bool and "/" not in meta["flag"]:
            kw["is_flag"] = True
        else:
            kw["show_default"] = f.default != ""
            if kind is float:
                kw["type"] = click.FloatRange(meta["lo"], meta["hi"])
            elif kind is int:
                kw["type"] = click.IntRange(meta["lo"], meta["hi"])
        fns = checks(meta)
        if fns:
            def callback(_ctx: Any, _param: Any, value: Any, fns: list[Callable[[Any], Any]] = fns) -> Any:
                try:
                    for fn in fns:
                        value = fn(value)
                except ValueError as e:
                    raise click.BadParameter(str(e)) from None
                return value
            kw["callback"] = callback
        out.append(click.option(meta["flag"], _dest(cls, f), **kw))
    return out


def from_kwargs(cls: type[T], kwargs: dict[str, Any]) -> T:
    """The dataclass ``cls`` from parsed flags; takes its entries out of ``kwargs``."""
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        dest = _dest(cls, f)
        if dest in kwargs:
            values[f.name] = kwargs.pop(dest)
    return cls(**values)


def validate(options: Any) -> None:
    """Apply the string checks to an options object built in code (tests, the lab)."""
    for f in dataclasses.fields(options):
        meta = f.metadata.get("stallscope")
        if meta is not None:
            for fn in checks(meta):
                fn(getattr(options, f.name))
