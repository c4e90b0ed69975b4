"""What makes a watched loader cheap to use as the loader itself: frameworks read its
attributes every batch (accelerate asks ``hasattr(loader, "state_dict")`` per batch), and
through a Python ``__getattr__`` each read cost 0.8 us, each miss 2.7 us (issue 19).

- Any proxy shares the wrapped object's instance dict, so its own attributes are found
  in C, as on the object itself.
- A DataLoader's proxy is, moreover, an instance of a subclass of the loader's class
  (made once per class): its methods, properties and misses are the class's own, run on
  the shared dict; only iteration (and ``__class__``, ``repr``) is the proxy's.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

_BOUND = 64  # classes remembered: a class made per call must not grow these without end
_DATA_DESCRIPTORS: dict[type, frozenset[str]] = {}
_SUBCLASSES: dict[type, type | None] = {}
SUBCLASSES: set[type] = set()  # the proxy classes made here (watch() knows its own)


def instance_dict(obj: object) -> dict[str, Any] | None:
    """``obj``'s instance dict, when a proxy can share it: a lookup through the proxy
    then meets its keys before the class's attributes, which differs from a lookup on
    ``obj`` only where a key is also a data descriptor (a property) of its class."""
    try:
        shared = object.__getattribute__(obj, "__dict__")
    except AttributeError:  # slots, or a builtin
        return None
    if type(shared) is not dict or not shared.keys().isdisjoint(_data_descriptors(type(obj))):
        return None
    return shared


def _data_descriptors(cls: type) -> frozenset[str]:
    names = _DATA_DESCRIPTORS.get(cls)
    if names is None:
        names = frozenset(name for klass in cls.__mro__ for name, value in vars(klass).items()
                          if hasattr(type(value), "__set__") or hasattr(type(value), "__delete__"))
        if len(_DATA_DESCRIPTORS) < _BOUND:
            _DATA_DESCRIPTORS[cls] = names
    return names


def subclass(cls: type, proxy_type: type) -> type | None:
    """A subclass of ``cls`` whose instances, given the slots of ``proxy_type`` and the
    shared dict of a ``cls`` instance, act as ``proxy_type``'s proxy of it; None where
    ``cls`` does not allow it (a slot of its own would not be shared, or a metaclass or
    ``__init_subclass__`` refuses), and the generic proxy is used."""
    if cls in _SUBCLASSES:
        return _SUBCLASSES[cls]
    if len(_SUBCLASSES) >= _BOUND:
        return None  # a new class per call would grow SUBCLASSES without end: generic proxy
    sub = _SUBCLASSES[cls] = _make(cls, proxy_type)
    return sub


def _make(cls: type, proxy_type: type) -> type | None:
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if set((slots,) if isinstance(slots, str) else slots) - {"__dict__", "__weakref__"}:
            return None
    mine = vars(proxy_type)
    watched_iter = mine["__iter__"]
    plain_iter = cls.__iter__  # type: ignore[attr-defined]

    def __iter__(self: Any) -> Any:
        try:
            self._ss_wrapped  # noqa: B018
        except AttributeError:  # built by type(proxy)(...), not by watch(): a plain loader
            return plain_iter(self)
        return watched_iter(self)

    namespace = {"__slots__": tuple(n for n in mine["__slots__"] if not n.startswith("__")),
                 "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__, "__iter__": __iter__,
                 "__class__": mine["__class__"], "__repr__": mine["__repr__"]}
    try:
        sub: type = type(cls)(cls.__name__, (cls,), namespace)
    except Exception:
        return None
    SUBCLASSES.add(sub)
    return sub
