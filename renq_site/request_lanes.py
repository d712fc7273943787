"""Django's ASGI handler with a fixed set of request threads ("lanes") per process.

Django's ASGIHandler gives every request a fresh ThreadSensitiveContext, so a request's
synchronous code (sync middleware, signals, a sync view) runs on a thread made for that request
alone. Connections are per thread, so every request would open a new PostgreSQL session (a
forked backend, authentication, catalog caches: more Postgres work than the request's own
queries) and CONN_MAX_AGE could reuse nothing.

Here each request is put on the least busy of `lanes` long-lived contexts; asgiref keeps one
thread per context, so a request's synchronous parts still run on one thread (what Django's
thread-sensitive mode needs) and that thread keeps its connection between requests, as a
threaded WSGI server's would. Requests on one lane take turns at that thread, never in the
middle of one synchronous call, so a transaction never spans two requests.

A request's synchronous work is one hop onto its lane: the request_started signal, building
the request, the middleware chain (the synchronous one a WSGI server runs) and the view, and,
for a response whose body is already in memory, its close (the request_finished signal). Each
crossing between the event loop and a lane wakes both threads. Django's async chain adapts
each middleware separately, so a REST request would cross a dozen times; its handler also
crosses once per signal and watches for a disconnect in a task of its own, which a
synchronous view cannot act on anyway. A streaming response (static files) is closed after
its body is sent, as Django does it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpResponse, HttpResponseBase
from django.urls import set_script_prefix

from renq_site.db_sessions import trust_recently_checked_sessions
from renq_site.middleware import DEPENDENCY_ERRORS, dependency_unavailable

# Each lane holds at most one PostgreSQL connection while it lives.
DEFAULT_LANES = int(os.environ.get("RENQ_WEB_LANES", "4"))


class DeferredResponse(HttpResponse):
    """A view's answer that is not ready yet: `resolve` makes it on the event loop once the
    request's lane is free again, so a view that waits (for a job's outcome) holds no lane
    while it waits. Headers the middleware set on this placeholder carry over."""

    def __init__(self, resolve: Callable[[], Awaitable[HttpResponseBase]]):
        super().__init__(status=202)
        self.resolve = resolve

    async def answer(self) -> HttpResponseBase:
        try:
            response = await self.resolve()
        except DEPENDENCY_ERRORS as exc:
            # Past the middleware: its 503 for an unavailable dependency is given here.
            response = dependency_unavailable(exc)
        for name, value in self.headers.items():
            if name not in response.headers and name.lower() not in _BODY_HEADERS:
                response.headers[name] = value
        return response


# Set by the placeholder's own (empty) body, not by the middleware.
_BODY_HEADERS = {"content-type", "content-length"}


class RequestLane:
    """One long-lived request thread and the number of requests using it."""

    __slots__ = ("executor", "in_flight")

    def __init__(self, name: str) -> None:
        # One call at a time on one thread: what a thread-sensitive context needs.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.in_flight = 0


class LanedASGIHandler(ASGIHandler):
    """`before_lane(scope, body_file)`: awaited on the event loop once the body is read, before
    the request goes to its lane (it may add to the scope; it must leave the body file at its
    start)."""

    def __init__(
        self,
        lanes: int = DEFAULT_LANES,
        before_lane: Callable[[dict, IO[bytes]], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__()
        self._before_lane = before_lane
        # The synchronous chain (ASGIHandler built the async one), run on a lane by respond.
        self.load_middleware(is_async=False)
        if lanes < 1:
            raise ValueError(f"RENQ_WEB_LANES must be at least 1, not {lanes}.")
        self.lanes = [RequestLane(f"renq-web-lane-{n}") for n in range(lanes)]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django serves HTTP only, not {scope['type']}.")
        lane = min(self.lanes, key=lambda candidate: candidate.in_flight)
        lane.in_flight += 1
        try:
            # asgiref's supported form: this request's thread-sensitive calls run on the
            # lane's executor, which outlives the request (the caller owns it).
            async with ThreadSensitiveContext(executor=lane.executor):
                await self.handle(scope, receive, send)
        finally:
            lane.in_flight -= 1

    async def handle(self, scope, receive, send) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            if self._before_lane is not None:
                await self._before_lane(scope, body_file)
            response = await sync_to_async(self.respond, thread_sensitive=True)(scope, body_file)
            if isinstance(response, DeferredResponse):
                response = await response.answer()
            try:
                # A client gone by now is uvicorn's to notice: sending to it does nothing.
                await self.send_response(response, send)
            finally:
                if response.streaming:
                    await sync_to_async(response.close, thread_sensitive=True)()
        finally:
            body_file.close()

    def respond(self, scope, body_file) -> HttpResponseBase:
        """On the request's lane: everything Django does synchronously for one request."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        # After Django's close_old_connections receiver (explicit: receivers run in the order
        # they were connected, which Django's test client changes).
        trust_recently_checked_sessions()
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # its body stays readable; sends request_finished
        return response
