"""glibc's allocator, set for a long-running daemon whose threads make large numpy
temporaries (mallopt(3)).

glibc raises its mmap threshold each time a large mapped block is freed ("dynamic"
M_MMAP_THRESHOLD, up to 32 MiB); from then on the correlator's window-sized temporaries
come from the per-thread arenas, where they fragment and stay: under the 8 ranks x 8
workers soak the agent's RSS crept up ~6 % from minute 5 to minute 15, in its thread
arenas (issue 14). A fixed threshold keeps large blocks in their own mappings, returned
to the kernel when freed, and two arenas instead of eight a core bound what the agent's
dozen threads can hold unused. Not glibc: nothing to do.
"""
from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 256 * 1024
ARENAS = 2


def tune() -> bool:
    """Set both before the agent's threads start; True when the C library took them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_ARENA_MAX, ARENAS))
