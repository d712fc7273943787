"""The result cache (a service's `enable_cache`) answers only what the same request would be
answered again: its key holds everything the engine sees, an answer is served for
RENQ_RESULT_CACHE_TTL_S at most, sampled generations are never served, and a hit is admitted
like any other job (rate limits and quotas) though it neither queues nor runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from inference.intake.submission import input_digest
from inference.jobs.vectors import split_result
from inference.models import Job, JobStatus

pytestmark = pytest.mark.django_db


def submit(api, **body):
    return api.post("/api/v1/jobs", body, format="json")


def _stored_embedding(tenant, service, payload: dict, vectors=((0.6, 0.8),)) -> Job:
    """A finished embedding job as the worker stores it."""
    result, packed = split_result({"embeddings": [list(v) for v in vectors], "dim": 2})
    return Job.objects.create(
        tenant=tenant,
        service=service,
        tier="api",
        input=payload,
        input_hash=input_digest(service, tenant, payload),
        status=JobStatus.SUCCEEDED,
        result=result,
        result_vectors=packed,
    )


def _finish(job_id, result: dict) -> None:
    now = timezone.now()
    Job.objects.filter(pk=job_id).update(
        status=JobStatus.SUCCEEDED, result=result, started_at=now, finished_at=now
    )


def test_the_key_holds_the_normalize_setting_the_engine_applies(api, make_service):
    service = make_service("embedding", enable_cache=True, normalize_embeddings=True)
    _stored_embedding(api.tenant, service, {"texts": ["same"]})
    # Naming the service's own default is the same request: the same answer.
    named = submit(api, service="embedding", input={"texts": ["same"], "normalize": True})
    assert named.json()["cached"] is True
    # The service now returns raw vectors: a normalised answer is not one of them.
    service.normalize_embeddings = False
    service.save()
    raw = submit(api, service="embedding", input={"texts": ["same"]}).json()
    assert (raw["cached"], raw["status"]) == (False, "queued")


def test_an_answer_older_than_the_ttl_is_not_served(api, make_service, settings):
    assert django_settings.RENQ_RESULT_CACHE_TTL_S > 0  # a default is set
    settings.RENQ_RESULT_CACHE_TTL_S = 60
    service = make_service("embedding", enable_cache=True)
    old = _stored_embedding(api.tenant, service, {"texts": ["old"]})
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(seconds=61))
    _stored_embedding(api.tenant, service, {"texts": ["new"]})
    assert submit(api, service="embedding", input={"texts": ["old"]}).json()["cached"] is False
    assert submit(api, service="embedding", input={"texts": ["new"]}).json()["cached"] is True


def test_a_cached_answer_does_not_renew_its_own_ttl(api, make_service, settings):
    settings.RENQ_RESULT_CACHE_TTL_S = 60
    service = make_service("embedding", enable_cache=True)
    first = _stored_embedding(api.tenant, service, {"texts": ["kept"]})
    hit = submit(api, service="embedding", input={"texts": ["kept"]}).json()
    assert hit["cached"] is True
    # The hit is a copy made now; the answer itself is as old as the job that computed it.
    Job.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(seconds=61))
    assert submit(api, service="embedding", input={"texts": ["kept"]}).json()["cached"] is False


@pytest.mark.parametrize(("temperature", "cached"), [(0.0, True), (0, True), (0.7, False)])
def test_only_greedy_generations_are_cached(api, make_service, temperature, cached):
    make_service("llm", enable_cache=True)
    payload = {"prompt": "Say hi", "max_tokens": 4, "temperature": temperature}
    first = submit(api, service="llm", input=payload).json()
    _finish(first["id"], {"text": "hi", "usage": {}, "finish_reason": "stop"})
    again = submit(api, service="llm", input=payload).json()
    assert again["cached"] is cached
    assert again["status"] == ("succeeded" if cached else "queued")


def test_a_hit_counts_against_the_rate_limits_and_quotas(
    api, make_service, admission_clock_fixed
):
    service = make_service("embedding", enable_cache=True, rate_limit=0)
    _stored_embedding(api.tenant, service, {"texts": ["same"]})
    api.tenant.requests_per_minute = 2
    api.tenant.save()
    codes = [submit(api, service="embedding", input={"texts": ["same"]}) for _ in range(3)]
    assert [r.status_code for r in codes] == [202, 202, 429]
    assert codes[-1].json()["error"]["quota"] == "requests_per_minute"
    assert Job.objects.filter(cached=True).count() == 2


def test_a_hit_is_refused_by_the_services_rate_limit_too(
    api, make_service, admission_clock_fixed
):
    service = make_service("embedding", enable_cache=True, rate_limit=1)
    _stored_embedding(api.tenant, service, {"texts": ["same"]})
    codes = [submit(api, service="embedding", input={"texts": ["same"]}) for _ in range(2)]
    assert [r.status_code for r in codes] == [202, 429]
    assert codes[1].json()["error"]["quota"] == "rate_limit"


def test_a_list_with_a_hit_is_admitted_or_refused_whole(api, make_service):
    service = make_service("embedding", enable_cache=True)
    _stored_embedding(api.tenant, service, {"texts": ["seen"]})
    api.tenant.requests_per_minute = 1
    api.tenant.save()
    items = [
        {"service": "embedding", "input": {"texts": ["seen"]}},
        {"service": "embedding", "input": {"texts": ["new"]}},
    ]
    response = api.post("/api/v1/jobs", items, format="json")
    assert response.status_code == 429
    assert Job.objects.count() == 1  # neither the hit's copy nor the new job was kept


def test_a_hit_neither_queues_nor_runs_so_a_full_queue_or_running_quota_does_not_refuse_it(
    api, make_service
):
    service = make_service("embedding", enable_cache=True, max_queue_size=1)
    _stored_embedding(api.tenant, service, {"texts": ["same"]})
    api.tenant.max_running_jobs = 1
    api.tenant.save()
    assert submit(api, service="embedding", input={"texts": ["queued"]}).status_code == 202
    # The queue is full and the tenant at its running-jobs quota: new work is refused...
    assert submit(api, service="embedding", input={"texts": ["more"]}).status_code in (429, 503)
    # ...but an answer that is already there is not work.
    hit = submit(api, service="embedding", input={"texts": ["same"]})
    assert hit.status_code == 202 and hit.json()["cached"] is True
