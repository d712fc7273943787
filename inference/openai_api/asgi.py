"""The ASGI handler that serves /v1/: Django's, without the middleware and the per-request
thread.

Django's ASGIHandler gives every request a ThreadSensitiveContext: the first synchronous call
in a request (a sync middleware, the request_started signal) creates a thread that stays parked
until the request ends. A front-door request spends most of its life waiting for its job, so
that would be one OS thread per waiting client. This handler routes the same URLconf with no
middleware (the views authenticate, limit bodies and answer errors in OpenAI's shape
themselves) and outside such a context, so signal receivers share one thread and the views' ORM
work runs on the bounded pool in db.py.
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response


class FrontDoorHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"/v1/ serves HTTP only, not {scope['type']}.")
        await self.handle(scope, receive, send)
