"""JSON over HTTP with the standard library, and the two ways a source can fail.

``Unreachable`` means nothing answered (refused, timed out, DNS): the report says so
and carries on with the other source. ``HttpError`` means a server answered with an
error status; the agent's and Prometheus' error bodies carry the reason, kept here.
"""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

TIMEOUT = 10.0


class SourceError(Exception):
    def __init__(self, url: str, message: str) -> None:
        super().__init__("%s (%s)" % (message, url))
        self.url = url
        self.message = message


class Unreachable(SourceError):
    pass


class HttpError(SourceError):
    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(url, "HTTP %d: %s" % (status, message))
        self.status = status
        self.reason = message


def base_url(url: str) -> str:
    """``host:port`` or a full URL → ``http://host:port`` without a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def get_json(url: str, params: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> Any:
    """The answer's JSON document, whatever its shape."""
    if params:
        url = url + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        raise HttpError(url, e.code, _reason(e)) from None
    except urllib.error.URLError as e:
        reason = e.reason
        text = getattr(reason, "strerror", None) or str(reason)
        raise Unreachable(url, "cannot connect: %s" % text) from None
    except (socket.timeout, TimeoutError):
        raise Unreachable(url, "no answer within %.0fs" % timeout) from None
    except (ConnectionError, OSError) as e:
        raise Unreachable(url, "cannot connect: %s" % (e.strerror or e)) from None
    except ValueError:
        raise HttpError(url, 200, "the answer is not JSON") from None


def _reason(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read().decode())
    except (ValueError, OSError):
        return err.reason or "error"
    return str(body.get("error") or body.get("message") or err.reason)
