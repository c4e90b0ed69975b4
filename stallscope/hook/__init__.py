"""The part of stallscope that runs inside the training process and its loader workers.

Imports only the standard library: a training process must not pay for numpy, HTTP
or prometheus_client because it was instrumented.
"""
from .files import DatasetRoot
from .shards import cache_lookup, record_shard_read, shard_read, storage_request
from .watch import unwatch, watch

__all__ = ["watch", "unwatch", "shard_read", "cache_lookup", "record_shard_read", "storage_request",
           "DatasetRoot"]
