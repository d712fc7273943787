"""The ASGI handler that serves /v1/: Django's, without the middleware and the per-request
thread.

Django's ASGIHandler gives every request a ThreadSensitiveContext: the first synchronous call
in a request (a sync middleware, the request_started signal) creates a thread that stays parked
until the request ends. A front-door request spends most of its life waiting for its job, so
that would be one OS thread per waiting client. This handler routes the same URLconf with no
middleware (the views authenticate, limit bodies and answer errors in OpenAI's shape
themselves) and outside such a context, and the views' ORM work runs on the bounded pool in
db.py.

Django's handler also crosses to a thread twice per request: to send request_started and to
close the response (request_finished). Their receivers (Django's: connection and cache
cleanup, for the calling context's connections, of which the event loop has none) are quick
and synchronous, so here they run on the event loop; only a streaming response is still closed
on a thread, as Django closes it.

An answer carries its Content-Length (CommonMiddleware's job elsewhere): without it the
server sends it chunked, which clients parse more slowly and HTTP/1.0 clients cannot.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix


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

    async def handle(self, scope, receive, send) -> None:
        """Django's ASGIHandler.handle, with the signals sent on the event loop: the view is
        cancelled if the client disconnects first; the response is sent, then closed."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, response = self.create_request(scope, body_file)
            if request is not None:
                response = await self._respond_unless_disconnected(request, receive, send)
            else:
                await self.send_response(response, send)
            if response is None:
                signals.request_finished.send(sender=self.__class__)
            elif response.streaming:
                await sync_to_async(response.close)()
            else:
                response.close()  # sends request_finished
        finally:
            body_file.close()

    async def send_response(self, response, send) -> None:
        if not response.streaming and not response.has_header("Content-Length"):
            response.headers["Content-Length"] = str(len(response.content))
        await super().send_response(response, send)

    async def _respond_unless_disconnected(self, request, receive, send):
        """The response sent (None: the client left before it was)."""

        async def respond():
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected while it was being sent
            return response

        listening = asyncio.create_task(self.listen_for_disconnect(receive))
        responding = asyncio.create_task(respond())
        await asyncio.wait((listening, responding), return_when=asyncio.FIRST_COMPLETED)
        for task in (listening, responding):
            if not task.done():
                task.cancel()  # a view may handle its cancellation
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            elif task is listening:
                try:
                    task.result()
                except RequestAborted:
                    pass
        try:
            return responding.result()
        except asyncio.CancelledError:
            return None
