"""A tenant's max_running_jobs holds exactly under concurrent POSTs: the count and the INSERTs
are one transaction under the tenant's lock, so submitters racing each other cannot all see
room for themselves."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from rest_framework.test import APIClient

from inference.dispatch.queues import service_queues
from inference.models import Job
from tests.conftest import purge_test_queues

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8
ROUNDS = 3


@pytest.fixture
def quota_service(make_service):
    service = make_service("noop", name="quota-noop")  # no worker: its jobs stay queued
    purge_test_queues(service_queues(service.name))
    yield service
    purge_test_queues(service_queues(service.name))


def _post_concurrently(key: str, path: str, bodies) -> list[int]:
    """THREADS clients POST at the same instant, ROUNDS times; every answer's status."""
    start = threading.Barrier(THREADS)

    def client(k: int) -> list[int]:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        codes = []
        try:
            for round_ in range(ROUNDS):
                start.wait(timeout=30)
                codes.append(api.post(path, bodies(k, round_), format="json").status_code)
        finally:
            connections.close_all()
        return codes

    with ThreadPoolExecutor(THREADS) as pool:
        return [code for codes in pool.map(client, range(THREADS)) for code in codes]


@pytest.mark.parametrize("limit", [1, 5])
def test_concurrent_posts_admit_exactly_max_running_jobs(make_tenant, quota_service, limit):
    tenant, key = make_tenant()
    tenant.max_running_jobs = limit
    tenant.save()

    codes = _post_concurrently(
        key,
        "/api/v1/jobs",
        lambda k, r: {"service": quota_service.name, "input": {"texts": [f"{k}-{r}"]}},
    )

    assert (codes.count(202), codes.count(429)) == (limit, THREADS * ROUNDS - limit)
    assert Job.objects.filter(tenant=tenant).count() == limit


def test_concurrent_lists_never_overshoot_max_running_jobs(make_tenant, quota_service):
    tenant, key = make_tenant()
    tenant.max_running_jobs = 7
    tenant.save()

    codes = _post_concurrently(
        key,
        "/api/v1/jobs",
        lambda k, r: [
            {"service": quota_service.name, "input": {"texts": [f"{k}-{r}-{i}"]}}
            for i in range(2)
        ],
    )

    # Lists of two against a quota of 7: three lists fit, the fourth would make 8.
    assert codes.count(202) == 3
    assert Job.objects.filter(tenant=tenant).count() == 6


def test_concurrent_bulk_jobs_admit_exactly_max_running_jobs(make_tenant, quota_service):
    tenant, key = make_tenant()
    tenant.max_running_jobs = 2
    tenant.save()

    codes = _post_concurrently(
        key,
        "/api/v1/jobs/bulk",
        lambda k, r: {"service": quota_service.name, "input": {"texts": [f"{k}-{r}", "x"]}},
    )

    assert (codes.count(202), codes.count(429)) == (2, THREADS * ROUNDS - 2)
    assert Job.objects.filter(tenant=tenant, is_bulk=True).count() == 2
