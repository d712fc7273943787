"""While RabbitMQ does not take a web process's publishes, its new realtime and api jobs get
503 with Retry-After instead of 202: stored, they would wait for the outbox sweep and expire
before it sends them (a RabbitMQ restart under a flood expired hundreds that way). Batch work
is still accepted, as are jobs of a service whose queue_timeout outlasts the outbox's wait, and
the broker is tried again a second after the last failure."""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError as BrokerError
from rest_framework.test import APIClient

from inference.dispatch import publishing
from inference.dispatch.broker import ready_message_counts
from inference.dispatch.queues import service_queues, tier_queue
from inference.intake.lookups import forget_all
from inference.models import Job, Service
from tests.conftest import purge_test_queues

pytestmark = pytest.mark.django_db(transaction=True)

SERVICE = "broker-away"


@pytest.fixture
def client(make_tenant, make_service):
    make_service("noop", name=SERVICE, queue_timeout=2.0, total_timeout=5.0)
    purge_test_queues(service_queues(SERVICE))
    _, key = make_tenant("broker-away")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    yield api
    purge_test_queues(service_queues(SERVICE))


@pytest.fixture
def broker_gone(monkeypatch):
    def refused(*_args, **_kwargs):
        raise BrokerError("[Errno 111] Connection refused")

    monkeypatch.setattr(publishing, "publish_task", refused)
    return monkeypatch


def submit(client, priority: str):
    body = {"service": SERVICE, "priority": priority, "input": {"texts": ["hello"]}}
    return client.post("/api/v1/jobs", body, format="json")


def test_after_a_failed_publish_interactive_jobs_are_refused_and_batch_accepted(
    client, broker_gone
):
    first = submit(client, "api")
    assert first.status_code == 202  # its publish failed: the outbox's
    assert Job.objects.get(pk=first.json()["id"]).published_at is None

    for priority in ("realtime", "api"):
        refused = submit(client, priority)
        assert refused.status_code == 503, refused.content
        assert refused["Retry-After"] == "1"
        assert refused.json()["error"]["quota"] == "broker"
    assert submit(client, "batch").status_code == 202


def test_the_broker_is_tried_again_once_the_hold_has_passed(client, broker_gone):
    assert submit(client, "api").status_code == 202
    assert submit(client, "api").status_code == 503
    broker_gone.undo()  # RabbitMQ is back

    broker_gone.setattr(publishing, "BROKER_AWAY_HOLD_S", 0.0)
    job = submit(client, "api")

    assert job.status_code == 202
    queue = tier_queue(SERVICE, "api")
    assert ready_message_counts([queue])[queue] == 1
    assert submit(client, "api").status_code == 202  # the publish went through: not away


def test_jobs_whose_start_promise_outlasts_the_outbox_are_still_accepted(
    client, broker_gone, make_service
):
    assert submit(client, "api").status_code == 202
    Service.objects.filter(name=SERVICE).update(queue_timeout=900, total_timeout=900)
    forget_all()  # the web's service cache, as a config change would

    assert submit(client, "api").status_code == 202
