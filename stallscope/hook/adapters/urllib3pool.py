"""urllib3: every request a connection pool makes, counted by its answer (issue 31, item
3: an object store that answers 503 "slow down" idles the fleet while the clients retry).

``requests``, ``botocore`` (boto3, and so most S3 readers) and many HTTP dataset clients
send through ``urllib3.connectionpool.HTTPConnectionPool``: each attempt is one
``_make_request`` call (urllib3 1.26 and 2.x), which returns the answer or raises when
none came. Each is counted with ``shards.storage_request``: its HTTP status, or no
answer (a timeout, a refused or reset connection); a retry when urllib3's own ``Retry``
(passed to the attempt since urllib3 2.0) already holds a failed attempt. botocore
retries above urllib3, so its repeats count as requests, not as retries.

The tier is the store the pool talks to: ``s3`` (``*.amazonaws.com``), ``gcs``
(``storage.googleapis.com``), ``azure`` (``*.blob.core.windows.net``), else ``http``.
Nothing about the request or its answer is changed or kept: the status is read, the
response returned as it came, an exception re-raised unchanged.
"""
from __future__ import annotations

import sys

from .. import shards, tiers

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

_HOSTS = ((".amazonaws.com", "s3"), ("storage.googleapis.com", "gcs"), (".blob.core.windows.net", "azure"))


def tier_of(host: object) -> str:
    """The tier of a store by its host name."""
    name = host.lower().rstrip(".") if isinstance(host, str) else ""
    for suffix, tier in _HOSTS:
        if name == suffix.lstrip(".") or name.endswith(suffix):
            return tier
    return "http"


def install() -> None:
    pool = sys.modules["urllib3.connectionpool"].HTTPConnectionPool
    original = pool._make_request
    if getattr(original, "_stallscope", False):
        return

    def _make_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            retry = bool(getattr(kwargs.get("retries"), "history", None))
            tier = tiers.bounded(tier_of(getattr(self, "host", None)))
        except Exception:
            retry, tier = False, tiers.OTHER
        try:
            response = original(self, *args, **kwargs)
        except BaseException as e:
            if isinstance(e, Exception):  # no answer came (KeyboardInterrupt is not the store's)
                shards.storage_request(tier, timeout=True, retry=retry)
            raise
        try:
            shards.storage_request(tier, status=int(response.status), retry=retry)
        except Exception:
            pass
        return response

    _make_request._stallscope = True  # type: ignore[attr-defined]
    _make_request.__wrapped__ = original  # type: ignore[attr-defined]
    pool._make_request = _make_request
