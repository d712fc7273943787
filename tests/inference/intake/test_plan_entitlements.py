"""Tier entitlements by plan (issue 27 item 2): a job is served in the tier it asks for moved by
its tenant's plan (enterprise -1, pro 0, free +1, clamped to P0..P3), realtime past the plan's
realtime cap is served as api, and the job shows both tiers and why they differ."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from inference.config.models import PlanPolicy
from inference.jobs.transitions import missed_deadline
from inference.models import Job, JobStatus
from inference.openai_api import jobs as openai_jobs
from inference.openai_api.endpoints import EMBEDDINGS, ENDPOINTS
from inference.workers.sweeper import expire_overdue

pytestmark = pytest.mark.django_db

TIERS = ["realtime", "api", "batch", "offline"]
# The seed's TIER_BOOST applied to the tier index, clamped to P0..P3.
EXPECTED = {
    ("enterprise", "realtime"): "realtime",
    ("enterprise", "api"): "realtime",
    ("enterprise", "batch"): "api",
    ("enterprise", "offline"): "batch",
    ("pro", "realtime"): "realtime",
    ("pro", "api"): "api",
    ("pro", "batch"): "batch",
    ("pro", "offline"): "offline",
    ("free", "realtime"): "api",
    ("free", "api"): "batch",
    ("free", "batch"): "offline",
    ("free", "offline"): "offline",
}


@pytest.fixture
def embedding(make_service):
    return make_service("embedding")


def client_of(make_tenant, name: str, plan: str) -> APIClient:
    tenant, key = make_tenant(name=name, plan=plan)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.tenant = tenant
    return client


def submit(client, **body):
    return client.post("/api/v1/jobs", {"service": "embedding", "input": {"texts": ["x"]}, **body},
                       format="json")  # fmt: skip


@pytest.mark.parametrize(("plan", "requested"), sorted(EXPECTED))
def test_the_served_tier_is_the_requested_one_moved_by_the_plan(make_tenant, embedding, plan,
                                                                 requested):  # fmt: skip
    client = client_of(make_tenant, f"t-{plan}", plan)
    response = submit(client, priority=requested)
    assert response.status_code == 202, response.content
    body = response.json()
    served = EXPECTED[plan, requested]
    assert (body["priority"], body["requested_priority"]) == (served, requested)
    job = Job.objects.get(pk=body["id"])
    assert (job.tier, job.requested_tier) == (served, requested)
    if served == requested:
        assert job.tier_reason == "" and body["priority_reason"] == ""
    else:
        assert f"{plan} plan: tier boost" in job.tier_reason
        assert body["priority_reason"] == job.tier_reason
    # GET shows both, as the list does.
    detail = client.get(f"/api/v1/jobs/{job.pk}").json()
    assert (detail["priority"], detail["requested_priority"]) == (served, requested)
    assert detail["priority_reason"] == job.tier_reason
    listed = client.get("/api/v1/jobs").json()
    (row,) = listed["results"] if isinstance(listed, dict) else listed
    assert (row["priority"], row["requested_priority"]) == (served, requested)


def test_the_tenants_default_tier_is_moved_too(make_tenant, embedding):
    tenant, key = make_tenant(name="quiet", plan="free", tier="realtime")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    body = submit(client).json()
    assert (body["priority"], body["requested_priority"]) == ("api", "realtime")


def test_a_configured_boost_replaces_the_default_and_is_clamped(make_tenant, embedding):
    PlanPolicy.objects.create(plan="pro", tier_boost=3, weight=1.0)
    client = client_of(make_tenant, "pushed-down", "pro")
    body = submit(client, priority="realtime").json()
    assert (body["priority"], body["requested_priority"]) == ("offline", "realtime")
    PlanPolicy.objects.filter(plan="pro").update(tier_boost=-3)  # sends no post_save
    PlanPolicy.objects.get(plan="pro").save()  # the change marker moves
    body = submit(client, priority="offline").json()
    assert body["priority"] == "realtime"


def test_list_posts_and_the_openai_front_door_share_the_tier_choice(make_tenant, embedding):
    client = client_of(make_tenant, "listed", "free")
    response = client.post(
        "/api/v1/jobs",
        [{"service": "embedding", "input": {"texts": [t]}, "priority": "realtime"} for t in "ab"],
        format="json",
    )
    assert response.status_code == 202, response.content
    assert {j["priority"] for j in response.json()["jobs"]} == {"api"}
    assert set(Job.objects.values_list("requested_tier", flat=True)) == {"realtime"}
    # /v1/embeddings with X-Renq-Priority: realtime, as its view submits it.
    _, key = make_tenant(name="oai-free", plan="free")
    job, _ = openai_jobs.submit(
        f"Bearer {key}", ENDPOINTS[EMBEDDINGS], {"model": "embedding", "input": "hi"}, "realtime"
    )
    assert (job.tier, job.requested_tier) == ("api", "realtime")


@pytest.fixture
def one_second(monkeypatch):
    """The cap counts per second: the test's requests all fall in one second of their own,
    however slowly the machine serves them."""
    from types import SimpleNamespace

    from inference.intake import entitlements

    frozen = float(uuid.uuid4().int % 10**9)
    monkeypatch.setattr(entitlements, "time", SimpleNamespace(time=lambda: frozen))


def test_realtime_past_the_plans_cap_is_served_as_api(make_tenant, embedding, one_second):
    PlanPolicy.objects.create(plan="enterprise", tier_boost=-1, weight=2.0, realtime_cap=3)
    client = client_of(make_tenant, "bursty", "enterprise")
    other = client_of(make_tenant, "calm", "enterprise")
    served = [submit(client, priority="realtime").json() for _ in range(5)]
    boosted = submit(client, priority="api").json()
    calm = submit(other, priority="realtime").json()
    assert [b["priority"] for b in served] == ["realtime"] * 3 + ["api"] * 2
    assert all(b["requested_priority"] == "realtime" for b in served)
    assert "realtime cap of 3 jobs/s" in served[-1]["priority_reason"]
    assert served[0]["priority_reason"] == ""
    # The cap is per tenant: another tenant of the same plan still gets realtime.
    assert calm["priority"] == "realtime"
    # An enterprise api job is realtime by the boost, so the cap applies to it too.
    assert (boosted["priority"], boosted["requested_priority"]) == ("api", "api")
    assert "tier boost -1" in boosted["priority_reason"]
    assert "realtime cap" in boosted["priority_reason"]


def test_a_refused_request_gives_its_realtime_slots_back(make_tenant, make_service, one_second):
    make_service("embedding", max_queue_size=1)
    PlanPolicy.objects.create(plan="pro", tier_boost=0, weight=1.0, realtime_cap=1)
    client = client_of(make_tenant, "refused", "pro")
    # Two realtime jobs do not fit a queue of one: 503, nothing stored.
    refused = client.post(
        "/api/v1/jobs",
        [{"service": "embedding", "input": {"texts": [t]}, "priority": "realtime"}
         for t in "ab"],  # fmt: skip
        format="json",
    )
    alone = submit(client, priority="realtime")
    assert refused.status_code == 503, refused.content
    assert alone.status_code == 202 and alone.json()["priority"] == "realtime"


def test_bulk_pieces_get_the_parents_tier_within_batch_and_offline(make_tenant, embedding):
    free = client_of(make_tenant, "free-bulk", "free")
    enterprise = client_of(make_tenant, "big-bulk", "enterprise")
    texts = {"texts": ["a", "b", "c"]}
    body = free.post("/api/v1/jobs/bulk", {"service": "embedding", "input": texts,
                                           "priority": "batch"}, format="json")  # fmt: skip
    assert body.status_code == 202, body.content
    parent = Job.objects.get(pk=body.json()["id"])
    assert (parent.tier, parent.requested_tier) == ("offline", "batch")
    assert {(p.tier, p.requested_tier) for p in parent.pieces.all()} == {("offline", "batch")}
    # Enterprise's batch would be api: a bulk promises no latency, so batch is its ceiling.
    for requested, served in (("batch", "batch"), ("offline", "batch")):
        bulk = {"service": "embedding", "input": texts, "priority": requested}
        body = enterprise.post("/api/v1/jobs/bulk", bulk, format="json")
        parent = Job.objects.get(pk=body.json()["id"])
        assert (parent.tier, parent.requested_tier) == (served, requested)
        assert {p.tier for p in parent.pieces.all()} == {served}


def test_batch_work_served_as_api_keeps_batchs_no_expiry(make_tenant, make_service):
    make_service("embedding", queue_timeout=0.5, total_timeout=1.0)
    client = client_of(make_tenant, "boosted", "enterprise")
    boosted = Job.objects.get(pk=submit(client, priority="batch").json()["id"])
    asked_api = Job.objects.get(pk=submit(client, priority="api").json()["id"])
    assert (boosted.tier, asked_api.tier) == ("api", "realtime")
    later = timezone.now() + timedelta(seconds=30)
    assert not missed_deadline(boosted, later)
    assert missed_deadline(asked_api, later)
    Job.objects.update(created_at=timezone.now() - timedelta(seconds=30))
    expire_overdue()
    assert Job.objects.get(pk=boosted.pk).status == JobStatus.QUEUED
    assert Job.objects.get(pk=asked_api.pk).status == JobStatus.EXPIRED


def test_the_admins_job_page_shows_both_tiers(admin_client, make_tenant, embedding):
    client = client_of(make_tenant, "shown", "free")
    job = Job.objects.get(pk=submit(client, priority="realtime").json()["id"])
    page = admin_client.get(f"/admin/inference/job/{job.pk}/change/").content.decode()
    assert "Requested tier" in page and "P0 realtime" in page and "P1 api" in page
    assert "free plan: tier boost +1" in page
