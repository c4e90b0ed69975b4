"""The CUDA device this training process computes on, for the agent's GPU <-> rank map.

Read once per epoch (when a watched loader starts an iterator, in the loop's own thread:
the current CUDA device is per host thread) and sent with the stream's reports, never on
the per-batch path. Only when torch is already imported and CUDA already initialised:
the hook never imports torch and never initialises CUDA itself.
"""
from __future__ import annotations

import sys


def cuda_device() -> dict[str, int | str] | None:
    """{"index": int, "uuid": "GPU-..."} of the current CUDA device, or None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        index = int(cuda.current_device())
        uuid = str(cuda.get_device_properties(index).uuid)
    except Exception:  # an old torch without .uuid, a broken driver: report nothing
        return None
    # torch prints the bare UUID ("3ee8a7b0-..."); NVML and DCGM spell it "GPU-3ee8a7b0-...".
    if not uuid.upper().startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    return {"index": index, "uuid": uuid}
