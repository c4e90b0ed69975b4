"""stallscope: are the GPUs waiting on the input pipeline, on which rank, and why?

In the trainer::

    import stallscope
    loader = stallscope.watch(loader)

This module imports only the hook (standard library only); the agent, the CLI and the
analysis live in submodules that a training process never loads.
"""
from .hook import unwatch, watch

__version__ = "0.1.0"
__all__ = ["watch", "unwatch", "__version__"]
