"""stallscope: are the GPUs waiting on the input pipeline, on which rank, and why?

In the trainer::

    import stallscope
    loader = stallscope.watch(loader)

and, for storage and caches, in any loader (see stallscope/hook/shards.py)::

    with stallscope.shard_read(url, tier="s3") as r: ...
    stallscope.cache_lookup("page", hit=True)
    stallscope.storage_request("s3", status=503, retry=True)

This module imports only the hook (standard library only); the agent, the CLI and the
analysis live in submodules that a training process never loads.
"""
from .hook import DatasetRoot, cache_lookup, record_shard_read, shard_read, storage_request, unwatch, watch

__version__ = "0.1.0"
__all__ = ["watch", "unwatch", "shard_read", "cache_lookup", "record_shard_read", "storage_request",
           "DatasetRoot", "__version__"]
