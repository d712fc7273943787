"""The front door's ASGI handler, driven in-process: Django's request signals still fire once
each per request, on the event loop rather than a thread of their own, and a client that
disconnects while its request waits cancels the wait at once."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from django.core import signals

from inference.openai_api.asgi import FrontDoorHandler


def _scope(path: str, method: str = "GET") -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


class _Signals:
    """Where and how often request_started and request_finished were sent."""

    def __init__(self) -> None:
        self.threads: dict[str, list[int]] = {"started": [], "finished": []}

    def __enter__(self) -> _Signals:
        signals.request_started.connect(self._started, weak=False)
        signals.request_finished.connect(self._finished, weak=False)
        return self

    def __exit__(self, *exc) -> None:
        signals.request_started.disconnect(self._started)
        signals.request_finished.disconnect(self._finished)

    def _started(self, **_kwargs) -> None:
        self.threads["started"].append(threading.get_ident())

    def _finished(self, **_kwargs) -> None:
        self.threads["finished"].append(threading.get_ident())


def _serve(handler, scope: dict, receive) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(handler(scope, receive, send))
    return sent


def _connected_client():
    """An ASGI receive: an empty request body, then a client that stays connected."""
    calls = []

    async def receive() -> dict:
        calls.append(1)
        if len(calls) == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()

    return receive


def test_request_signals_fire_once_each_on_the_event_loop():
    with _Signals() as seen:
        sent = _serve(FrontDoorHandler(), _scope("/v1/models"), _connected_client())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 401
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["error"]["code"] == "invalid_api_key"
    here = threading.get_ident()  # asyncio.run runs the loop on this thread
    assert seen.threads == {"started": [here], "finished": [here]}


def test_an_answer_carries_its_content_length():
    # Not sent chunked: an HTTP/1.0 client could not read it, and every client parses more.
    sent = _serve(FrontDoorHandler(), _scope("/v1/models"), _connected_client())
    headers = dict(sent[0]["headers"])
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert int(headers[b"Content-Length"]) == len(body) > 0


class _WaitingHandler(FrontDoorHandler):
    """A view that waits for a job no worker will run."""

    cancelled = False

    async def run_get_response(self, request):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            type(self).cancelled = True
            raise


def test_a_client_that_disconnects_cancels_its_waiting_request():
    calls = []

    async def receive() -> dict:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(0.2)
        return {"type": "http.disconnect"}

    started = time.monotonic()
    with _Signals() as seen:
        sent = _serve(_WaitingHandler(), _scope("/v1/embeddings", "POST"), receive)
    assert time.monotonic() - started < 5
    assert _WaitingHandler.cancelled
    assert sent == []  # nobody to answer
    assert len(seen.threads["started"]) == len(seen.threads["finished"]) == 1
