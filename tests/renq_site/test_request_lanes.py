"""The web keeps its PostgreSQL connections between requests, as `make web` runs it (gunicorn +
uvicorn): Django's own ASGI handler gave every request a new thread and so a new connection
(a forked Postgres backend each time); renq_site.request_lanes runs requests on a few
long-lived threads per process that keep theirs."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.core.signals import request_finished, request_started
from django.db import connection, connections

from renq_site.request_lanes import DeferredResponse, LanedASGIHandler
from tests.renq_site.helpers import asgi_web_server, child_database_url

pytestmark = pytest.mark.django_db(transaction=True)

APP_NAME = "renq-lanes-test"
LANES = 2


def _web_backends() -> set[tuple[int, object]]:
    """(pid, backend_start) of every Postgres session the test web process holds open."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = %s",
            [APP_NAME],
        )
        return set(cursor.fetchall())


def test_requests_reuse_a_bounded_set_of_connections(make_tenant, make_service):
    from inference.models import Job

    tenant, key = make_tenant("lanes")
    job = Job.objects.create(tenant=tenant, service=make_service("noop"), input={"texts": ["x"]})
    env = {
        "DATABASE_URL": f"{child_database_url()}?application_name={APP_NAME}",
        "RENQ_DB_CONN_MAX_AGE": "60",
        "RENQ_WEB_LANES": str(LANES),
    }
    with asgi_web_server("test-lanes-web", env=env) as url:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {key}"

        def get(_: int) -> int:
            return session.get(f"{url}/api/v1/jobs/{job.pk}", timeout=10).status_code

        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(get, range(40))) == {200}
            first = _web_backends()
            assert set(pool.map(get, range(40))) == {200}
            second = _web_backends()

    # Every request queried the job; the connections doing it stayed open, at most one per
    # lane, and the second 40 requests used the same backends (none forked for them).
    assert 1 <= len(first) <= LANES
    assert second == first


def _asgi_get(handler, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict, bytes]:
    """One GET through the ASGI handler in this process: (status, headers, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    pending = [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # the client stays connected

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(handler(scope, receive, send))
    headers = {name.lower(): value for name, value in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


# Django says so of every FileResponse it serves over ASGI (whitenoise's static files here too).
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
def test_a_request_is_one_hop_onto_its_lane_with_both_signals(make_tenant, make_service):
    # Django's handler hops to the request thread for request_started, for the view and for
    # request_finished; each hop wakes two threads, on every request.
    from inference.models import Job

    tenant, key = make_tenant("hops")
    job = Job.objects.create(tenant=tenant, service=make_service("noop"), input={"texts": ["x"]})
    handler = LanedASGIHandler(lanes=1)
    lane = handler.lanes[0].executor
    hops: list = []
    submit = lane.submit
    lane.submit = lambda fn, *args, **kwargs: hops.append(fn) or submit(fn, *args, **kwargs)
    signals: list[str] = []

    def started(**_kwargs) -> None:
        signals.append("started")

    def finished(**_kwargs) -> None:
        signals.append("finished")

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        auth = [(b"authorization", f"Bearer {key}".encode())]
        status, _, body = _asgi_get(handler, f"/api/v1/jobs/{job.pk}", auth)
        assert (status, json.loads(body)["id"]) == (200, str(job.pk))
        assert (len(hops), signals) == (1, ["started", "finished"])
        # A streamed body (a static file) is sent whole, with both signals.
        signals.clear()
        status, headers, body = _asgi_get(handler, "/static/admin/css/base.css", [])
        assert status == 200 and len(body) == int(headers[b"content-length"]) > 0
        assert signals == ["started", "finished"]
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
        submit(connections.close_all).result()
        lane.shutdown()


def test_a_lane_health_checks_its_kept_session_at_most_once_a_second(
    make_tenant, make_service, monkeypatch
):
    # Django's CONN_HEALTH_CHECKS is a SELECT 1 round trip before every request's first query:
    # under load, one round trip in five of a single-job POST.
    from inference.models import Job

    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    tenant, key = make_tenant("checks")
    job = Job.objects.create(tenant=tenant, service=make_service("noop"), input={"texts": ["x"]})
    handler = LanedASGIHandler(lanes=1)
    lane = handler.lanes[0].executor
    lane_db = lane.submit(lambda: connections["default"]).result()
    checks: list[int] = []
    is_usable = lane_db.is_usable
    lane_db.is_usable = lambda: checks.append(1) or is_usable()
    auth = [(b"authorization", f"Bearer {key}".encode())]

    def get() -> int:
        return _asgi_get(handler, f"/api/v1/jobs/{job.pk}", auth)[0]

    try:
        # The first request opens the session; the second checks it; the next three trust it.
        assert [get() for _ in range(5)] == [200] * 5
        assert len(checks) == 1
        session, checked_at = lane_db.renq_checked
        lane_db.renq_checked = (session, checked_at - 1.5)  # as if checked 1.5 s ago
        assert get() == 200
        assert len(checks) == 2
        assert lane_db.connection is session  # the same session throughout
    finally:
        lane.submit(connections.close_all).result()
        lane.shutdown()


def test_a_waiting_answer_whose_database_went_away_is_a_503_with_retry_after():
    """A POST ?wait= or GET ?wait= answers on the event loop, past the middleware: its read
    of the job failing on a stopped PostgreSQL answers as the middleware would."""
    from django.db import OperationalError

    async def read_fails():
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    response = asyncio.run(DeferredResponse(read_fails).answer())
    assert response.status_code == 503
    assert response["Retry-After"]
    assert json.loads(response.content)["error"]["code"] == "service_unavailable"
