"""HTTP/1.x on the wire for the agent's server (httpserver.py): a request head parsed
from bytes, with its limits, and a response encoded to bytes. No I/O here.

The agent serves GET and HEAD without bodies, so a request is its head: the request
line and header fields. Everything a hostile or broken client can send fails as an
``HttpError`` with the status a node daemon answers (400, 405, 414, 431, 505).
"""
from __future__ import annotations

import dataclasses
import email.utils
import http
import json
import re
import time

MAX_REQUEST_LINE = 8192     # longer: 414 (what BaseHTTPRequestHandler allows is 65536)
MAX_HEADER_BYTES = 16384    # the header fields after the request line; more: 431
MAX_HEADERS = 100           # field lines; more: 431 (http.client's own limit)
METHODS = ("GET", "HEAD")
ALLOW = ", ".join(METHODS)

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)\Z")
_TARGET = re.compile(rb"[\x21-\x7e]+\Z")  # visible ASCII: no spaces, no controls
# RFC 9110 5.5: a field value is visible characters, spaces, tabs and obs-text; NUL, CR,
# LF and the other controls must be rejected (a proxy that passes them on differs from
# one that cuts the value there: request smuggling).
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*\Z")


class HttpError(Exception):
    """A request answered with ``status`` and a one-line reason, then the connection is
    closed (after a malformed request the stream's framing cannot be trusted)."""

    def __init__(self, status: int, reason: str, allow: bool = False) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.allow = allow


@dataclasses.dataclass
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]     # lower-cased names; repeated fields joined with ", "
    keep_alive: bool
    has_body: bool              # a body the agent will not read: close after answering


@dataclasses.dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    allow: bool = False         # 405: say which methods are served
    retry_after: int | None = None  # 429/503: seconds to wait before asking again


def head_end(buf: bytes | bytearray) -> int:
    """Where the request head ends in ``buf`` (the index after its blank line), or -1
    if it has not all arrived; a limit already passed raises HttpError."""
    start = len(buf) - len(bytes(buf).lstrip(b"\r\n"))  # blank lines before a request: ignored
    line_end = buf.find(b"\n", start)
    if (line_end if line_end >= 0 else len(buf)) - start > MAX_REQUEST_LINE:
        raise HttpError(414, "request line longer than %d bytes" % MAX_REQUEST_LINE)
    end = -1
    for sep in (b"\r\n\r\n", b"\n\n", b"\n\r\n"):  # bare LF line ends are accepted too
        at = buf.find(sep, start)
        if at >= 0 and (end < 0 or at + len(sep) < end):
            end = at + len(sep)
    if (end if end >= 0 else len(buf)) - max(line_end, start) > MAX_HEADER_BYTES + 4:
        raise HttpError(431, "header fields longer than %d bytes" % MAX_HEADER_BYTES)
    return end


def parse(head: bytes) -> Request:
    """One request head (what head_end delimits) → Request, or HttpError."""
    lines = head.strip(b"\r\n").split(b"\n")
    parts = lines[0].rstrip(b"\r").split(b" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    v = _VERSION.match(version)
    if v is None:
        raise HttpError(400, "malformed HTTP version")
    if v.group(1) != b"1" or v.group(2) not in (b"0", b"1"):
        raise HttpError(505, "HTTP version %s not supported (HTTP/1.0 and 1.1 are)" % version.decode())
    if not _TOKEN.match(method):
        raise HttpError(400, "malformed method")
    if not _TARGET.match(target):
        raise HttpError(400, "malformed request target")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "more than %d header fields" % MAX_HEADERS)
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        line = raw.rstrip(b"\r")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):  # also obsolete line folding (leading space)
            raise HttpError(400, "malformed header field")
        key = name.decode("ascii").lower()
        if not _FIELD_VALUE.match(value):
            raise HttpError(400, "control character in header field %s" % key)
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = headers[key] + ", " + text if key in headers else text
    if method.decode() not in METHODS:
        raise HttpError(405, "method %s not allowed" % method.decode(), allow=True)
    length = headers.get("content-length", "0")
    if not all(x.strip().isdigit() for x in length.split(",")) or \
            len({x.strip() for x in length.split(",")}) != 1:
        raise HttpError(400, "malformed Content-Length")
    has_body = int(length.split(",")[0]) > 0 or "transfer-encoding" in headers
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    minor = v.group(2) == b"1"
    keep = ("close" not in tokens) if minor else ("keep-alive" in tokens)
    return Request(method.decode(), target.decode("ascii"), version.decode(), headers,
                   keep_alive=keep and not has_body, has_body=has_body)


def error(status: int, reason: str, allow: bool = False, retry_after: int | None = None) -> Response:
    return Response(status, (json.dumps({"error": reason}) + "\n").encode(), allow=allow,
                    retry_after=retry_after)


_date: tuple[int, str] = (0, "")


def _date_header() -> str:
    """The Date field (RFC 9110 asks an origin server with a clock for one), once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, email.utils.formatdate(now, usegmt=True))
    return _date[1]


def encode_head(r: Response, keep_alive: bool, keep_alive_asked: bool = False) -> bytes:
    """The status line and header fields of ``r``; HEAD sends these alone, with the
    Content-Length of the body a GET gets."""
    phrase = http.HTTPStatus(r.status).phrase if r.status in http.HTTPStatus._value2member_map_ else ""
    lines = ["HTTP/1.1 %d %s" % (r.status, phrase), "Date: " + _date_header(),
             "Content-Type: " + r.content_type, "Content-Length: %d" % len(r.body)]
    if r.allow:
        lines.append("Allow: " + ALLOW)
    if r.retry_after is not None:
        lines.append("Retry-After: %d" % r.retry_after)
    if not keep_alive:
        lines.append("Connection: close")
    elif keep_alive_asked:  # an HTTP/1.0 client that asked for it is told it got it
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
