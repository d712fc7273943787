"""/api/schema/ from a real web process, as a client fetching the docs meets it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.renq_site.helpers import asgi_web_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_fresh_web_process_answers_concurrent_schema_requests_alike():
    # drf-spectacular's generator is not thread-safe: a fresh process's first requests race.
    with asgi_web_server("test-schema-web") as url:
        with ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(lambda _: requests.get(f"{url}/api/schema/", timeout=60), range(4))
            )
    assert [a.status_code for a in answers] == [200] * 4
    assert len({a.content for a in answers}) == 1
    assert b"/api/v1/jobs" in answers[0].content
