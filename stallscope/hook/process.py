"""Who this process reports as, shared by the hook's parts: the rank identity (set by
``watch()`` in the trainer, handed to loader workers by batches.py) and the role."""
from __future__ import annotations

import sys

from . import channel, identity

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from .identity import Ident

ident: Ident | None = None    # the identity dict of the last watch() in this process, or of its rank
role = "main"   # "worker" inside a DataLoader worker


def get_ident() -> Ident:
    global ident
    if ident is None:
        ident = identity.detect()
    return ident


def get_role() -> str:
    """"worker" in any DataLoader worker, even one of a loader nobody watched."""
    if role == "main":
        data = sys.modules.get("torch.utils.data")
        info = getattr(data, "get_worker_info", None) if data is not None else None
        if info is not None and info() is not None:
            return "worker"
    return role


def flush_at_exit() -> None:
    """Loader workers leave through os._exit, which skips atexit; multiprocessing still
    runs its finalizers first (BaseProcess._bootstrap → util._exit_function)."""
    from multiprocessing import util
    util.Finalize(None, _flush, exitpriority=0)


def _flush() -> None:
    try:
        channel.get().flush()
    except Exception:
        pass
