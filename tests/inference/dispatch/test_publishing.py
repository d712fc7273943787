"""The one publish path: the outbox and the recoveries send a job where its backend is."""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.dispatch.placement import record_decision
from inference.dispatch.publishing import republish_unpublished
from inference.models import Job, JobStatus
from inference.workers.sweeper import take_over_lapsed_leases
from routing.models import AttemptOutcome, JobAttempt
from routing.router import RoutingDecision
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _routed_job_left_behind(tenant, service, backend) -> Job:
    """A job routed to a cloud backend whose publish never happened (the broker was down)."""
    job = Job.objects.create(
        tenant=tenant,
        service=service,
        tier="batch",  # batch work waits as long as it takes; an api job would expire
        input={"texts": ["left behind"]},
        created_at=timezone.now() - timedelta(seconds=60),
    )
    record_decision(job, RoutingDecision(backend, "test: routed to the cloud"))
    return job


def test_outbox_republishes_a_routed_job_to_its_backend_not_the_local_queue(
    io_workers, make_tenant, make_service, make_backend, make_route, upstream
):
    # No GPU worker consumes this service: a message on its local tier queue would sit there.
    service = make_service("embedding", name="outboxed")
    free = make_backend("free")
    make_route(service, (free, 0))
    tenant, _ = make_tenant()
    job = _routed_job_left_behind(tenant, service, free)

    assert republish_unpublished() == 1

    done = wait_for_job(job.pk, timeout_s=20)
    assert done.status == JobStatus.SUCCEEDED, done.error
    attempt = JobAttempt.objects.get(job=done)
    assert (attempt.backend, attempt.outcome) == (free, AttemptOutcome.SUCCEEDED)


def test_a_lapsed_claim_of_a_routed_job_is_taken_over_on_its_backend(
    io_workers, make_tenant, make_service, make_backend, make_route, upstream
):
    service = make_service("embedding", name="deadclaim")
    free = make_backend("free")
    make_route(service, (free, 0))
    tenant, _ = make_tenant()
    job = _routed_job_left_behind(tenant, service, free)
    Job.objects.claim([job.pk], worker="an I/O worker that died")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    assert take_over_lapsed_leases() == 1

    done = wait_for_job(job.pk, timeout_s=20)
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert done.attempts == 2
    assert JobAttempt.objects.get(job=done).backend == free


def test_a_submission_is_published_with_no_second_write_to_its_job(make_tenant, make_service):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake.submission import submit_job
    from tests.conftest import purge_test_queues

    make_service("noop", name="one-write")  # no worker: the message stays in its queue
    purge_test_queues(service_queues("one-write"))
    tenant, _ = make_tenant()
    with CaptureQueriesContext(connection) as queries:
        job = submit_job(tenant=tenant, service_name="one-write", payload={"texts": ["x"]})
    job_updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "inference_job"')]
    assert job_updates == []
    job.refresh_from_db()
    assert job.published_at == job.created_at
    assert ready_message_counts([tier_queue("one-write", job.tier)]) == {
        tier_queue("one-write", job.tier): 1
    }


def test_a_submission_publishes_its_dispatch_message_and_no_task_sent_event(
    make_tenant, make_service
):
    # Celery's task-sent event was a second publish (and publisher confirm) per dispatch
    # message on the submit path; Flower sees the tasks from the workers' events.
    from kombu import Exchange, Queue

    from inference.dispatch.queues import service_queues
    from inference.intake.submission import submit_job
    from renq_site.celery import app
    from tests.conftest import purge_test_queues

    make_service("noop", name="no-sent-event")  # no worker: the message stays in its queue
    purge_test_queues(service_queues("no-sent-event"))
    tenant, _ = make_tenant()
    with app.connection_for_write() as connection:
        events = Queue(
            "", Exchange("celeryev", type="topic"), routing_key="task.#", exclusive=True
        )(connection.default_channel)
        events.declare()
        submit_job(tenant=tenant, service_name="no-sent-event", payload={"texts": ["x"]})
        time.sleep(0.2)  # an event would have been routed by now
        sent = []
        while (message := events.get(no_ack=True)) is not None:
            # Workers of other tests (the session's control worker) send their events too,
            # some grouped into one message as a list.
            payload = message.payload
            for event in payload if isinstance(payload, list) else [payload]:
                kind = message.headers.get("type") or event.get("type")
                sent.append((kind, event.get("name")))
    assert ("task-sent", "inference.run_job") not in sent, sent


def test_a_publish_that_fails_at_submission_leaves_the_job_to_the_outbox(
    make_tenant, make_service, monkeypatch
):
    from inference.dispatch import publishing
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake.submission import submit_job
    from tests.conftest import purge_test_queues

    make_service("noop", name="outbox-submit")
    purge_test_queues(service_queues("outbox-submit"))
    tenant, _ = make_tenant()
    with monkeypatch.context() as broker_down:
        broker_down.setattr(publishing, "_send", lambda target, jobs, tag: False)
        job = submit_job(tenant=tenant, service_name="outbox-submit", payload={"texts": ["x"]})
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and job.published_at is None
    queue = tier_queue("outbox-submit", job.tier)
    assert ready_message_counts([queue]) == {queue: 0}
    assert republish_unpublished(older_than_s=0) == 1
    assert ready_message_counts([queue]) == {queue: 1}


def test_a_submission_committed_as_postgres_goes_away_is_accepted_and_sent(
    make_tenant, make_service, monkeypatch
):
    # Its publish looks up the tenant's plan weight, which looks for configuration changes in
    # Postgres: that look failing once the jobs are committed must not make them a 503.
    from django.db import OperationalError

    from inference.config import changes
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake import submission
    from tests.conftest import purge_test_queues

    make_service("noop", name="committed-then-away")
    purge_test_queues(service_queues("committed-then-away"))
    tenant, _ = make_tenant()
    away = False
    last_update, execute = changes.config_last_update, submission._group_commit._execute

    def marker():
        if away:
            raise OperationalError("server closed the connection unexpectedly")
        return last_update()

    def committed_then_away(statements):
        nonlocal away
        execute(statements)
        away = True

    monkeypatch.setattr(changes, "config_last_update", marker)
    monkeypatch.setattr(submission._group_commit, "_execute", committed_then_away)
    job = submission.submit_job(
        tenant=tenant, service_name="committed-then-away", payload={"texts": ["x"]}
    )

    queue = tier_queue("committed-then-away", job.tier)
    assert ready_message_counts([queue]) == {queue: 1}


def test_a_committed_submission_whose_publish_fails_goes_to_the_outbox(
    make_tenant, make_service, monkeypatch
):
    from inference.intake import submission

    make_service("noop", name="publish-raised")
    tenant, _ = make_tenant()

    def raising(jobs, **kwargs):
        raise RuntimeError("the publish broke")

    monkeypatch.setattr(submission, "publish_many", raising)
    job = submission.submit_job(
        tenant=tenant, service_name="publish-raised", payload={"texts": ["x"]}
    )

    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and job.published_at is None  # the outbox's now


def test_a_dispatch_message_carries_the_headers_celery_writes_for_the_task():
    # The worker runs what Celery's own as_task_v2 would have sent: a Celery upgrade that
    # changes the task protocol fails here, not in a worker that cannot read the message.
    from inference.dispatch.publishing import task_message
    from renq_site.celery import app

    ours = task_message("inference.run_job", ["a-job-id"], priority=2)
    task_id = ours.headers["id"]
    celery = app.amqp.as_task_v2(task_id, "inference.run_job", args=["a-job-id"])
    expected = dict(celery.headers, ignore_result=True)
    assert ours.headers == expected
    assert json.loads(ours.body) == json.loads(json.dumps(list(celery.body)))
    assert ours.properties["correlation_id"] == task_id
    assert (ours.properties["delivery_mode"], ours.properties["priority"]) == (2, 2)


def test_a_publish_after_the_kept_connection_died_still_reaches_the_queue(
    make_tenant, make_service
):
    # A broker restart kills the connections kept between publishes; the next submission
    # must not be left to the outbox because of it.
    from inference.dispatch import publishing
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake.submission import submit_job
    from tests.conftest import purge_test_queues

    make_service("noop", name="kept-died")
    purge_test_queues(service_queues("kept-died"))
    tenant, _ = make_tenant()
    submit_job(tenant=tenant, service_name="kept-died", payload={"texts": ["warm"]})
    kept = list(publishing._channels._idle)
    assert kept, "the channel is kept for the next publish"
    for channel in kept:
        channel._connection.connection.sock.shutdown(socket.SHUT_RDWR)

    job = submit_job(tenant=tenant, service_name="kept-died", payload={"texts": ["after"]})

    job.refresh_from_db()
    assert job.published_at is not None
    queue = tier_queue("kept-died", job.tier)
    assert ready_message_counts([queue]) == {queue: 2}


def test_a_publish_to_a_queue_the_broker_lost_declares_it_again(make_tenant, make_service):
    # A broker restarted without its data (or a queue deleted) forgets a queue the kept
    # channel declared; a publish must not vanish into the default exchange.
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake.submission import submit_job
    from renq_site.celery import app
    from tests.conftest import purge_test_queues

    make_service("noop", name="queue-lost")
    tenant, _ = make_tenant()
    first = submit_job(tenant=tenant, service_name="queue-lost", payload={"texts": ["before"]})
    queue = tier_queue("queue-lost", first.tier)
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(queue)

    job = submit_job(tenant=tenant, service_name="queue-lost", payload={"texts": ["after"]})

    job.refresh_from_db()
    assert job.published_at is not None
    assert ready_message_counts([queue]) == {queue: 1}
    purge_test_queues(service_queues("queue-lost"))


@pytest.mark.parametrize(("batch_size", "messages"), [(64, 13), (256, 4), (4096, 2)])
def test_jobs_submitted_together_travel_an_eighth_of_a_batch_to_a_message(
    make_tenant, make_service, batch_size, messages
):
    # 100 jobs in one submission: 8 to a message for a service batching 64 (13 messages),
    # 32 for one batching 256, never more than 64. Each message is a publish, a confirm, a
    # fetch and an ack; the jobs of one the batch cannot take wait claimed for the next.
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake.submission import accept, prepare
    from tests.conftest import purge_test_queues

    name = f"per-message-{batch_size}"
    make_service("noop", name=name, batch_size=batch_size)
    purge_test_queues(service_queues(name))
    tenant, _ = make_tenant()
    requests = [
        prepare(tenant, service_name=name, payload={"texts": [f"t{i}"]}, priority="batch")
        for i in range(100)
    ]

    jobs = accept(tenant, requests)

    queue = tier_queue(name, "batch")
    assert ready_message_counts([queue]) == {queue: messages}
    published = Job.objects.filter(pk__in=[j.pk for j in jobs], published_at__isnull=False)
    assert published.count() == 100


def _ready_headers(queue: str) -> list[dict]:
    from renq_site.celery import app

    headers = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            headers.append(message.headers)
    return headers


def test_a_realtime_jobs_message_carries_its_input_unless_it_is_large(make_tenant, make_service):
    # The worker starts a realtime job's pass while it claims it (workers/gpu/early_pass.py).
    from inference.dispatch.publishing import INPUT_HEADER, MAX_CARRIED_INPUT_BYTES
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.intake.submission import submit_job
    from tests.conftest import purge_test_queues

    make_service("noop", name="carried-input")
    purge_test_queues(service_queues("carried-input"))
    tenant, _ = make_tenant()
    small = {"texts": ["hello"]}
    large = {"texts": ["x" * MAX_CARRIED_INPUT_BYTES]}
    for payload, priority in ((small, "realtime"), (large, "realtime"), (small, "batch")):
        submit_job(tenant=tenant, service_name="carried-input", payload=payload, priority=priority)

    realtime = _ready_headers(tier_queue("carried-input", "realtime"))
    batch = _ready_headers(tier_queue("carried-input", "batch"))

    assert [json.loads(h[INPUT_HEADER]) if INPUT_HEADER in h else None for h in realtime] == [
        small,
        None,
    ]
    assert [INPUT_HEADER in h for h in batch] == [False]
