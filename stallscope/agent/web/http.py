"""The agent's HTTP face: /metrics, /healthz and the versioned JSON API (/api/v1/...),
on the bounded server of httpserver.py.

Routes are plain functions ``(query) -> (status, body)`` from api.py and the parts;
bad parameters get a 400 with a reason, a failing route a 500 naming the exception's
type. Every route answers GET and HEAD (the same header fields, no body); other
methods get 405 with ``Allow: GET, HEAD``.
"""
from __future__ import annotations

import json
import threading
import urllib.parse
from typing import Any, Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ...host import ApiError
from . import httpwire, scrapefirst
from .httppool import Stats
from .httpserver import Server
from .httpwire import Request, Response

Done = Callable[[Response], None]


def _internal(e: BaseException) -> Response:
    return _json(500, {"error": "internal error: %s" % type(e).__name__})


def _json(status: int, body: Any) -> Response:
    return Response(status, (json.dumps(body, indent=1, default=str) + "\n").encode())


class SingleFlight:
    """/metrics renders one at a time, and every scrape that arrives while one is in
    progress is answered with its bytes instead of queueing a render of its own.

    Which renders a scrape may share: the one in progress when it arrives, or (when none
    is) the one it starts; never one that had finished before it arrived, so nothing is
    cached. What a scrape gets is thus at most one render's duration older than its
    arrival, and a scraper never sees older values than its previous scrape got: that
    scrape's render had finished before this one arrived, and renders do not overlap,
    so the one in progress now began after it. (Taking only renders begun after the
    arrival would also let a caller that changed the agent's state just before scraping
    see its change, but a hook's report reaches the agent asynchronously anyway, and it
    would cost a scrape up to two renders' time: under 50 scrapers, every one.)"""

    def __init__(self, render: Callable[[], bytes], submit: Callable[[Callable[[], None]], None]) -> None:
        self.render = render
        self.submit = submit
        self._lock = threading.Lock()
        self._waiting: list[Done] | None = None  # not None: a render is in progress

    def join(self, done: Done) -> None:
        with self._lock:
            if self._waiting is not None:
                self._waiting.append(done)
                return
            self._waiting = [done]
        self.submit(self._run)

    def _run(self) -> None:
        try:
            with scrapefirst.SCRAPES.serving():  # the correlator waits (scrapefirst.py)
                body = self.render()
            response = Response(200, body, CONTENT_TYPE_LATEST)
        except Exception as e:  # Parts.render isolates the parts; this is a last guard
            response = _internal(e)
        finally:
            with self._lock:
                waiting, self._waiting = self._waiting or [], None
        for done in waiting:
            done(response)


# JSON API requests being answered or queued at once; more get 429 with Retry-After.
# Four workers answer them: twice that queued keeps each one's wait at about one answer.
MAX_API_IN_FLIGHT = 8
RETRY_AFTER_S = 1
# Answers from what the agent made already (a rank's diagnosis from its latest analysis)
# being encoded at once, on their own worker; past that, 429 too. Each takes milliseconds.
MAX_MADE_IN_FLIGHT = 32
MADE_CACHE = 1024  # encoded answers kept, by request target (the oldest go first)


class Made:
    """A route whose answer may come, while the API is answering others, from what the
    agent has made already: ``made(query)`` returns None (not made: the route computes
    it, as any API request, 429 when too many are) or
    ``(token, build)``: ``build()`` gives (status, body) from what was made, and an answer
    encoded for the same target and an equal token is served again as it is. It runs on
    the server's loop thread: a few lookups, never the analysis."""

    def __init__(self, route: Callable[..., tuple[int, Any]],
                 made: Callable[[Any], tuple[Any, Callable[[], tuple[int, Any]]] | None]) -> None:
        self.route = route
        self.made = made

    def __call__(self, query: Any) -> tuple[int, Any]:
        return self.route(query)


class App:
    """What to answer: dispatch() runs on the server's loop thread and never blocks.

    In order (issue 33: at 256 ranks under 50 closed-loop API clients, /healthz took p99
    14.6 s behind them and the liveness probe would have restarted a healthy agent):
    /healthz is answered on the loop thread itself, waiting for no worker (``healthy``
    reads flags, never blocks); /metrics renders on the server's own worker
    (``submit_first``), which the API never queues on; the JSON API shares the pool, at
    most MAX_API_IN_FLIGHT at once, and past that gets 429 with ``Retry-After`` (what can
    wait); but while any API request is being answered, a route's answer from what was
    made already (``Made``: a rank's diagnosis from its latest analysis, issue 50) is
    served on the loop thread when it was encoded already, else encoded on a worker of
    its own (``submit_made``)."""

    def __init__(self, render: Callable[[], bytes], routes: dict[str, Callable[..., tuple[int, Any]]],
                 healthy: Callable[[], tuple[bool, str]], max_api_in_flight: int = MAX_API_IN_FLIGHT) -> None:
        self.routes = routes
        self.healthy = healthy
        self.max_api_in_flight = max_api_in_flight
        self.api_in_flight = 0  # loop thread increments, workers decrement: under the lock
        self._lock = threading.Lock()
        self.submit: Callable[[Callable[[], None]], None] = lambda job: job()  # set by make_server
        self.submit_first: Callable[[Callable[[], None]], None] = lambda job: job()
        self.submit_made: Callable[[Callable[[], None]], None] = lambda job: job()
        self.metrics = SingleFlight(render, lambda job: self.submit_first(job))
        self.made_in_flight = 0
        self.made_cache: dict[str, tuple[Any, Response]] = {}  # target -> (token, answer)

    def dispatch(self, request: Request, done: Done) -> None:
        path = urllib.parse.urlsplit(request.target).path
        if path == "/healthz":
            return done(self.health())
        if path == "/metrics":  # HEAD too: its Content-Length is the rendered body's
            return self.metrics.join(done)
        # A request that would wait behind another gets what was made already, if it was
        # (made for the asking when the API is idle: a fresh answer costs nobody a wait).
        route = self.routes.get(path)
        if isinstance(route, Made) and self.api_in_flight > 0 and self._made(request.target, route, done):
            return None
        with self._lock:
            if self.api_in_flight >= self.max_api_in_flight:
                busy = True
            else:
                busy, self.api_in_flight = False, self.api_in_flight + 1
        if busy:
            return done(httpwire.error(429, "the API is answering %d requests: retry in %d s"
                                       % (self.max_api_in_flight, RETRY_AFTER_S),
                                       retry_after=RETRY_AFTER_S))

        def job() -> None:
            try:
                response = self.answer(request.target)
            finally:
                with self._lock:
                    self.api_in_flight -= 1
            done(response)
        return self.submit(job)

    def _made(self, target: str, route: Made, done: Done) -> bool:
        """Answer ``target`` from what was made already, if it was: True when answered
        (or queued to be, or refused with 429)."""
        try:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query, keep_blank_values=True)
            found = route.made(query)
        except Exception:  # the route itself says what is wrong with the request
            found = None
        if found is None:
            return False
        token, build = found
        hit = self.made_cache.get(target)
        if hit is not None and hit[0] == token:
            done(hit[1])
            return True
        with self._lock:
            busy = self.made_in_flight >= MAX_MADE_IN_FLIGHT
            if not busy:
                self.made_in_flight += 1
        if busy:
            done(httpwire.error(429, "the API is encoding %d answers: retry in %d s"
                                % (MAX_MADE_IN_FLIGHT, RETRY_AFTER_S), retry_after=RETRY_AFTER_S))
            return True

        def job() -> None:
            try:
                status, body = build()
                response = _json(status, body)
                self.made_cache.pop(target, None)
                self.made_cache[target] = (token, response)
                while len(self.made_cache) > MADE_CACHE:
                    self.made_cache.pop(next(iter(self.made_cache)))
            except Exception as e:
                response = _internal(e)
            finally:
                with self._lock:
                    self.made_in_flight -= 1
            done(response)
        self.submit_made(job)
        return True

    def health(self) -> Response:
        try:
            ok, text = self.healthy()
        except Exception as e:
            return _internal(e)
        return Response(200 if ok else 503, (text + "\n").encode(), "text/plain")

    def answer(self, target: str) -> Response:
        url = urllib.parse.urlsplit(target)
        try:
            if url.path == "/healthz":
                return self.health()
            route = self.routes.get(url.path)
            if route is None:
                raise ApiError(404, "no such endpoint %s" % url.path)
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            status, body = route(query)
        except ApiError as e:
            status, body = e.status, {"error": e.message}
        except Exception as e:  # a bug in one route must not kill the server
            return _internal(e)
        try:
            return _json(status, body)
        except Exception as e:  # a body json cannot encode is that route's bug too
            return _internal(e)


def parse_listen(addr: str) -> tuple[str, int]:
    host, sep, port_text = addr.rpartition(":")
    if not sep:
        raise ValueError("--listen must be HOST:PORT or :PORT, got %r" % addr)
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError("--listen port must be a number, got %r" % addr) from None
    if not 0 <= port <= 65535:
        raise ValueError("--listen port out of range: %r" % addr)
    return host, port


def make_server(addr: str, render: Callable[[], bytes], routes: dict[str, Any],
                healthy: Callable[[], tuple[bool, str]], stats: Stats | None = None,
                **limits: Any) -> Server:
    """The agent's server, bound (OSError if it cannot be); serve_forever() serves it,
    shutdown() stops it. ``limits``: Server's keyword arguments (workers, timeouts ...)."""
    app = App(render, routes, healthy)
    server = Server(parse_listen(addr), app.dispatch, stats=stats, **limits)
    app.submit, app.submit_first, app.submit_made = server.submit, server.submit_first, server.submit_made
    return server
