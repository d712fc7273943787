"""Django's ASGI handler with a fixed set of request threads ("lanes") per process.

Django's ASGIHandler gives every request a fresh ThreadSensitiveContext, so a request's
synchronous code (sync middleware, signals, a sync view) runs on a thread made for that request
alone. Connections are per thread, so every request opened a new PostgreSQL session (a forked
backend, authentication, catalog caches: measured at 1.03 sessions and ~15 ms of Postgres CPU
per single-job POST) and CONN_MAX_AGE could reuse nothing.

Here each request is put on the least busy of `lanes` long-lived contexts; asgiref keeps one
thread per context, so a request's synchronous parts still run on one thread (what Django's
thread-sensitive mode needs) and that thread keeps its connection between requests, as a
threaded WSGI server's would. Requests on one lane take turns at that thread, never in the
middle of one synchronous call, so a transaction never spans two requests.

The middleware chain is the synchronous one a WSGI server runs, called in one hop onto the lane.
Django's async chain adapts each middleware separately: MiddlewareMixin runs every
process_request/process_response through sync_to_async, and a sync-only middleware switches
back to the event loop with async_to_sync, so a REST request crossed between the loop and its
lane thread a dozen times, each crossing a wake-up of both threads (measured: the web's CPU
per single-job POST was more than the in-process test client's by about 2 ×).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase

# Each lane holds at most one PostgreSQL connection while it lives.
DEFAULT_LANES = int(os.environ.get("RENQ_WEB_LANES", "4"))


class RequestLane:
    """One long-lived request thread and the number of requests using it."""

    __slots__ = ("executor", "in_flight")

    def __init__(self, name: str) -> None:
        # One call at a time on one thread: what a thread-sensitive context needs.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.in_flight = 0


class LanedASGIHandler(ASGIHandler):
    def __init__(self, lanes: int = DEFAULT_LANES) -> None:
        super().__init__()
        # The synchronous chain (ASGIHandler built the async one), run by get_response_async.
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

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # Middleware, view and error logging in one call on the request's lane thread.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
