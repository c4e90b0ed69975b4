"""glibc's allocator, set for a long-running daemon whose threads make large numpy
temporaries (mallopt(3), malloc_trim(3)).

glibc raises its mmap threshold each time a large mapped block is freed ("dynamic"
M_MMAP_THRESHOLD, up to 32 MiB); from then on the correlator's window-sized temporaries
come from the per-thread arenas, where the pages they free stay in RSS: under the 8 ranks
x 8 workers soak the agent's RSS crept up ~5 % from minute 5 to minute 15, in its thread
arenas, while its analysis windows filled (issue 14). So: a fixed threshold keeps large
blocks in their own mappings, returned to the kernel when freed; two arenas instead of
eight a core bound what the agent's dozen threads hold; and every TRIM_S the free pages
inside the arenas go back (malloc_trim releases whole free pages anywhere in an arena,
not only at its top), so RSS follows what the agent holds, not its past peaks.

The threshold is 64 KiB, not 256: a 5-minute window of one rank's batches is ~30,000
numbers, 240 KB an array, just under 256 KiB, so a full analysis of 8 ranks took ~12 MiB
of such arrays from the arenas and left them free there until the next trim; with the
trim every 30 s the soak's RSS swung between 72 and 82 MiB by when it was read (free
heap 1-13 MiB) and read +14 % from minute 5 to 30. At 64 KiB those arrays are mapped
and unmapped (a page fault a page, well under a ms a run), and a trim every 5 s (~0.2
ms) keeps what the small ones leave: an 8-minute soak read 71.0-72.4 MiB after minute 4.
Not glibc: nothing to do.
"""
from __future__ import annotations

import ctypes
from typing import Any

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 64 * 1024
ARENAS = 2
TRIM_S = 5.0


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


LIBC = _libc()


def tune() -> bool:
    """Set both before the agent's threads start; True when the C library took them."""
    if LIBC is None:
        return False
    return bool(LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(LIBC.mallopt(M_ARENA_MAX, ARENAS))


def trim() -> None:
    """The agent's periodic job: free pages back to the kernel (a few ms)."""
    if LIBC is not None:
        LIBC.malloc_trim(0)
