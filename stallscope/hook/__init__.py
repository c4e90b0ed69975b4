"""The part of stallscope that runs inside the training process and its loader workers.

Imports only the standard library: a training process must not pay for numpy, HTTP
or prometheus_client because it was instrumented.
"""
from .watch import unwatch, watch

__all__ = ["watch", "unwatch"]
