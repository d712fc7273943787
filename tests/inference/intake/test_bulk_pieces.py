"""A bulk job's pieces are jobs like the others (Issue #27): the parent's tenant and tier, a
route, their tier queue, aging; the parent is finished by whoever stores its last piece. And
a tenant's backlog, a bulk job's pieces or a flood of jobs, never takes the room other tenants
need in the queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from inference.dispatch.broker import ready_message_counts
from inference.dispatch.publishing import destination
from inference.dispatch.queues import service_queues, tier_queue
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus
from inference.workers.sweeper import promote_waiting_jobs
from routing.models import Backend, JobRoute
from tests.conftest import purge_test_queues
from tests.inference.job_rows import job_rows_read

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_queue(make_service):
    """A no-op service nobody consumes (its jobs stay queued) with room for 20: 18 jobs for
    non-realtime work, each other tenant counted up to 5 of them (RENQ_TENANT_QUEUE_SHARE)."""
    service = make_service("noop", name="bulk-room", batch_size=8, max_queue_size=20)
    purge_test_queues(service_queues(service.name))
    yield service
    purge_test_queues(service_queues(service.name))


@pytest.fixture(autouse=True)
def _quarter_share(settings):
    settings.RENQ_TENANT_QUEUE_SHARE = 0.25


def client_of(make_tenant, name: str) -> APIClient:
    tenant, key = make_tenant(name=name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.tenant = tenant
    return client


def post_job(client: APIClient, service, priority: str = "batch", text: str = "x"):
    body = {"service": service.name, "input": {"texts": [text]}, "priority": priority}
    return client.post("/api/v1/jobs", body, format="json")


def post_bulk(client: APIClient, service, texts: int, priority: str = "batch"):
    body = {
        "service": service.name,
        "input": {"texts": [f"text {i}" for i in range(texts)]},
        "priority": priority,
    }
    return client.post("/api/v1/jobs/bulk", body, format="json")


def test_a_bulk_larger_than_the_queue_leaves_other_tenants_their_room(make_tenant, small_queue):
    bulky = client_of(make_tenant, "bulky")
    other = client_of(make_tenant, "other")
    third = client_of(make_tenant, "third")
    # 400 texts, 50 pieces of 8: more than the whole queue, admitted by the bulk's own budget.
    bulk = post_bulk(bulky, small_queue, 400)
    assert bulk.status_code == 202, bulk.content
    assert bulk.json()["progress"]["total"] == 50

    # The bulk counts 5 against each other tenant: 13 of their jobs fit below the 18.
    codes = [post_job(other, small_queue, text=f"o{i}").status_code for i in range(13)]
    assert codes == [202] * 13
    full = post_job(other, small_queue)
    assert full.status_code == 503 and full.json()["error"]["quota"] == "max_queue_size"
    assert "counted against you" in full.json()["error"]["message"]
    # A third tenant still has room: each of the other two counts only 5 against it.
    assert post_job(third, small_queue, priority="realtime").status_code == 202
    # The bulk's own tenant sees its 50 pieces: its own backlog fills its room.
    assert post_job(bulky, small_queue).status_code == 503
    assert Job.objects.filter(service=small_queue, status=JobStatus.QUEUED).count() == 50 + 13 + 1


def test_one_tenants_flood_cannot_fill_the_queue_for_the_others(make_tenant, small_queue):
    flooder = client_of(make_tenant, "flooder")
    quiet = client_of(make_tenant, "quiet")
    # Alone, a tenant may use the whole queue (less the realtime reserve).
    codes = [post_job(flooder, small_queue, text=f"f{i}").status_code for i in range(19)]
    assert codes == [202] * 18 + [503]
    # Its 18 count as 5 against another tenant.
    assert post_job(quiet, small_queue).status_code == 202


def test_a_bulks_backlog_costs_other_submitters_only_what_it_counts(make_tenant, small_queue):
    # 1,000 pieces count as 5 against another tenant: its submission's check reads about
    # that many rows, not the 1,000 (which every submission to the service would wait for
    # in turn, under the service's lock).
    from django.db import connection, transaction

    from inference.intake.admission import QueueCapacityCheck

    bulk = post_bulk(client_of(make_tenant, "bulky"), small_queue, 8000)
    assert bulk.status_code == 202 and bulk.json()["progress"]["total"] == 1000
    other, _ = make_tenant(name="other")
    check = QueueCapacityCheck(small_queue, "batch", jobs=1, tenant=other)

    def counted() -> tuple:
        with connection.cursor() as cursor:
            cursor.execute(*check.statement())
            return cursor.fetchone()

    with transaction.atomic():
        read, answer = job_rows_read(counted)
        transaction.set_rollback(True)
    assert answer == (5,)  # what counts against the other tenant
    assert read < 50


def test_pieces_keep_the_parents_tenant_and_tier_and_are_routed_to_their_tier_queue(
    make_tenant, small_queue, make_route
):
    local = Backend.objects.create(name="bulk-local", kind="local", service_kinds=["noop"])
    make_route(small_queue, (local, 0))
    client = client_of(make_tenant, "routed")
    response = post_bulk(client, small_queue, 24, priority="offline")
    assert response.status_code == 202, response.content
    parent = Job.objects.get(pk=response.json()["id"])
    pieces = list(parent.pieces.select_related("service", "route__backend"))
    assert len(pieces) == 3
    assert {(p.tenant_id, p.tier, p.status) for p in pieces} == {
        (client.tenant.pk, "offline", JobStatus.QUEUED)
    }
    # Each piece has a route, as a job submitted alone would: the cascade and the stranded
    # jobs' rescue read it.
    assert set(JobRoute.objects.filter(job__in=pieces).values_list("backend", flat=True)) == {
        local.pk
    }
    assert {destination(p).queue for p in pieces} == {tier_queue(small_queue.name, "offline")}
    assert ready_message_counts([tier_queue(small_queue.name, "offline")]) == {
        tier_queue(small_queue.name, "offline"): 1  # one tenant's jobs: one message
    }


def test_pieces_age_like_other_jobs(make_tenant, small_queue):
    from inference.config.tiers import tier_policies

    assert tier_policies()["offline"].aging_after_s > 0
    client = client_of(make_tenant, "ageing")
    response = post_bulk(client, small_queue, 16, priority="offline")
    assert response.status_code == 202, response.content
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(parent_id=response.json()["id"]).update(created_at=long_ago)
    assert promote_waiting_jobs() == 2
    assert set(
        Job.objects.filter(parent_id=response.json()["id"]).values_list("serving_tier", flat=True)
    ) == {"api"}  # offline → batch → api: an hour is past both thresholds


def test_the_parent_is_finished_by_whoever_stores_its_last_piece(make_tenant, small_queue):
    client = client_of(make_tenant, "finisher")
    response = post_bulk(client, small_queue, 20)
    parent_id = response.json()["id"]
    pieces = list(Job.objects.filter(parent_id=parent_id).order_by("piece_index"))
    assert len(pieces) == 3

    def run(piece_set: list[Job]) -> None:
        claim = Job.objects.claim([p.pk for p in piece_set], worker="test")
        outcomes = [Outcome(job=j, result={"count": len(j.input["texts"])}) for j in claim.jobs]
        Job.objects.store_outcomes(claim.token, outcomes)

    run(pieces[:2])
    assert Job.objects.get(pk=parent_id).status == JobStatus.RUNNING
    run(pieces[2:])
    parent = Job.objects.get(pk=parent_id)
    assert parent.status == JobStatus.SUCCEEDED
    assert parent.result == {"count": 20}


def test_a_bulk_whose_commit_reply_was_lost_is_refused_yet_dispatched(
    make_tenant, small_queue, monkeypatch
):
    # Its pieces may be stored (here they are), each counted as published: they get their
    # messages now, not from the lost-message sweep. The client hears 503 and may retry.
    from django.db import OperationalError, connection

    from inference.intake.bulk import submit_bulk
    from inference.intake.row_writer import OutcomeUnknown

    tenant, _ = make_tenant("reply-lost")
    commit = connection._commit

    def committed_then_lost():
        commit()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(connection, "_commit", committed_then_lost)
    with pytest.raises(OutcomeUnknown):
        submit_bulk(
            tenant=tenant,
            service_name=small_queue.name,
            payload={"texts": [f"text {i}" for i in range(12)]},
        )
    monkeypatch.undo()

    pieces = Job.objects.filter(tenant=tenant, parent__isnull=False)
    assert pieces.count() >= 2
    assert not pieces.filter(published_at__isnull=True).exists()
    queue = tier_queue(small_queue.name, pieces[0].tier)
    assert ready_message_counts([queue])[queue] >= 1
