"""The web keeps its PostgreSQL connections between requests, as `make web` runs it (gunicorn +
uvicorn): Django's own ASGI handler gave every request a new thread and so a new connection
(a forked Postgres backend each time); renq_site.request_lanes runs requests on a few
long-lived threads per process that keep theirs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection

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
