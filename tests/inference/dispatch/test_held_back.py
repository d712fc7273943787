"""A backlog far behind in its tenant's fair share waits in Postgres, not in RabbitMQ, and
comes out in start-tag order: the bands only order what lies within a few quanta."""

from __future__ import annotations

import pytest
from django.db import InterfaceError

from inference.dispatch import fair_share, publishing
from inference.dispatch.broker import ready_message_counts
from inference.dispatch.publishing import release_held, republish_unpublished
from inference.dispatch.queues import service_queues, tier_queue
from inference.intake import submission
from inference.intake.row_writer import OutcomeUnknown
from inference.intake.submission import JobRequest, submit_job, submit_jobs
from inference.jobs.tiers import Tier
from inference.jobs.transitions import JobQuerySet
from inference.models import Job
from inference.workers.sweeper import release_unfed_held
from tests.conftest import purge_test_queues

pytestmark = pytest.mark.django_db(transaction=True)

SERVICE = "held-back"
QUEUE = tier_queue(SERVICE, "batch")
TEN_TOKENS = "x" * 40


@pytest.fixture
def served_service(make_service):
    """A one-job batch service whose batch queue a worker has just taken from (nothing is
    held back from a queue nobody takes from)."""
    service = make_service("noop", name=SERVICE, batch_size=1, batch_timeout=0.001)
    purge_test_queues(service_queues(SERVICE))
    fair_share.advance({QUEUE: 0.0})
    return service


def submit(tenant, n: int) -> list[Job]:
    return [
        submit_job(
            tenant=tenant, service_name=SERVICE, payload={"texts": [TEN_TOKENS]}, priority="batch"
        )
        for _ in range(n)
    ]


def ready() -> int:
    return ready_message_counts([QUEUE])[QUEUE]


def test_a_deep_backlog_is_held_back_in_postgres_and_the_outbox_leaves_it(
    served_service, make_tenant
):
    tenant, _ = make_tenant("deep")
    submit(tenant, 10)

    # Starts 0, 10 and 20 go out; the rest lie three quanta (one 10-token job here) or more
    # ahead.
    assert ready() == 3
    held = Job.objects.held_back().filter(service__name=SERVICE)
    assert sorted(held.values_list("held_start", flat=True)) == [30.0 + 10 * n for n in range(7)]
    assert republish_unpublished(older_than_s=0) == 0
    assert ready() == 3


def test_one_submission_of_many_messages_holds_each_at_its_own_start(
    served_service, make_tenant
):
    tenant, _ = make_tenant("listed")
    requests = [JobRequest(served_service, Tier.BATCH, {"texts": [TEN_TOKENS]})] * 20
    submit_jobs(tenant, requests)

    # Messages of 8, 8 and 4 jobs: starts 0 (out at once), 80 and 160 (held).
    held = Job.objects.held_back().values_list("held_start", flat=True)
    assert sorted(held) == [80.0] * 8 + [160.0] * 4
    assert ready() == 1


def test_held_work_is_released_earliest_start_first_whoever_sent_it_first(
    served_service, make_tenant
):
    first, _ = make_tenant("first")
    second, _ = make_tenant("second")
    early = submit(first, 10)  # its held starts: 30 … 90
    # The same starts, sent after all of the first tenant's; its 10 and 20 lie before the
    # held work and go out, its 30 and later are held behind the first tenant's 30.
    late = submit(second, 10)
    purge_test_queues([QUEUE])  # what went out at once is taken

    # The earliest start tags, 30 and 40 of each tenant (four of the service's one-job
    # batches), not the first tenant's next four by arrival.
    assert release_held(SERVICE, "batch") == 4
    still_held = set(Job.objects.held_back().values_list("pk", flat=True))
    assert still_held == {job.pk for job in early[5:] + late[5:]}
    assert ready() == 2  # a message per tenant
    assert fair_share.clock(QUEUE).earliest_held == 50
    fair_share.advance({QUEUE: 40.0})  # a worker took them
    assert release_held(SERVICE, "batch") == 4
    assert set(Job.objects.held_back().values_list("pk", flat=True)) == {
        job.pk for job in early[7:] + late[7:]
    }


def test_held_work_whose_release_dies_before_its_publish_is_left_to_the_outbox(
    served_service, make_tenant, monkeypatch
):
    tenant, _ = make_tenant("cut-short")
    submit(tenant, 10)  # start 0 goes out, 9 are held
    purge_test_queues([QUEUE])
    held = list(Job.objects.held_back().values_list("pk", flat=True))

    def terminated(*_args, **_kwargs):
        raise SystemExit(-15)  # Celery ends the pool process on a broker connection loss

    monkeypatch.setattr(publishing, "_send_ids", terminated)
    with pytest.raises(SystemExit):
        release_held(SERVICE, "batch")
    monkeypatch.undo()

    # Taken from the holds, never sent: the outbox's, not lost until the lost-message sweep.
    unsent = Job.objects.filter(pk__in=held, status="queued", held_start__isnull=True)
    assert unsent.count() >= 1 and not unsent.filter(published_at__isnull=False).exists()
    assert republish_unpublished(older_than_s=0) == unsent.count()
    assert ready() >= 1


def test_work_postgres_cannot_hold_goes_out_to_rabbitmq_at_once(
    served_service, make_tenant, monkeypatch
):
    # The connection broke after the jobs' COMMIT (psycopg2 then says InterfaceError, not a
    # DatabaseError): counted as published, without a message they would wait for the
    # lost-message sweep.
    def connection_lost(self, start):
        raise InterfaceError("connection already closed")

    monkeypatch.setattr(JobQuerySet, "hold_back", connection_lost)
    tenant, _ = make_tenant("unholdable")
    submit(tenant, 10)

    assert ready() == 10
    assert not Job.objects.held_back().exists()
    assert not Job.objects.filter(published_at__isnull=True).exists()


def test_a_submission_whose_commit_reply_was_lost_is_never_held(
    served_service, make_tenant, monkeypatch
):
    # Its COMMIT may still be under way: a hold written now could miss the row.
    group_commit = submission._group_commit
    execute = group_commit._execute

    def committed_then_lost(statements):
        execute(statements)
        raise OutcomeUnknown("server closed the connection unexpectedly")

    tenant, _ = make_tenant("reply-lost")
    submit(tenant, 3)  # starts 0, 10 and 20: the next would be held
    monkeypatch.setattr(group_commit, "_execute", committed_then_lost)
    with pytest.raises(OutcomeUnknown):
        submit(tenant, 1)

    assert ready() == 4
    assert not Job.objects.held_back().exists()


def test_the_sweeper_releases_held_work_of_a_queue_nobody_takes_from(served_service, make_tenant):
    tenant, _ = make_tenant("stranded")
    submit(tenant, 10)
    purge_test_queues([QUEUE])  # the one that went out was taken; no worker takes more

    assert release_unfed_held() == 3  # start tags 30 to 50: three quanta of one job here
    assert ready() == 1  # one message
    assert release_unfed_held() == 0  # the queue holds a message again
    assert Job.objects.held_back().count() == 4


def test_nothing_is_held_from_a_queue_no_worker_has_taken_from(make_service, make_tenant):
    make_service("noop", name=SERVICE, batch_size=1, batch_timeout=0.001)
    purge_test_queues(service_queues(SERVICE))
    tenant, _ = make_tenant("early")
    submit(tenant, 10)

    assert ready() == 10
    assert not Job.objects.held_back().exists()


def test_a_light_tenants_next_job_goes_ahead_of_the_released_work(served_service, make_tenant):
    from inference.config.models import DEFAULT_PLAN_WEIGHTS, PlanPolicy
    from renq_site.celery import app

    for plan, weight in DEFAULT_PLAN_WEIGHTS.items():
        PlanPolicy.objects.update_or_create(
            plan=plan, defaults={"tier_boost": 0, "weight": weight}
        )
    flooder, _ = make_tenant("flooder")
    light, _ = make_tenant("light", plan="enterprise")  # weight 2: a job is half a quantum
    submit(flooder, 10)
    purge_test_queues([QUEUE])  # its first job was taken
    assert release_held(SERVICE, "batch") == 3  # starts 10, 20 and 30: within 3 quanta of V
    first, second = submit(light, 2)  # starts 0 (its tenant had nothing ahead) and 5

    # The second starts half a quantum past V: among the released work, in arrival order, it
    # would wait for all of it, up to three quanta.
    with app.connection_for_read() as connection:
        queue = app.amqp.queues[QUEUE](connection.channel())
        taken = [queue.get(no_ack=True).decode()[0][0] for _ in range(3)]
    assert taken[:2] == [str(first.pk), str(second.pk)], taken  # then the flood's message


def _release_elsewhere() -> int:
    """A worker's release, on its own Postgres session (it sees only committed holds)."""
    from django.db import connections

    try:
        return release_held(SERVICE, "batch")
    finally:
        connections.close_all()


def test_a_release_that_looked_before_a_hold_committed_leaves_it_noted(
    make_service, make_tenant
):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import transaction

    from inference.dispatch.publishing import publish_many

    make_service("noop", name=SERVICE, batch_size=1, batch_timeout=0.001)
    purge_test_queues(service_queues(SERVICE))
    tenant, _ = make_tenant("racing")
    jobs = submit(tenant, 3)[:2]  # no worker took from the queue yet: all go out (0 to 20)
    purge_test_queues([QUEUE])
    fair_share.advance({QUEUE: 0.0})  # a worker takes from the queue now

    with transaction.atomic():
        publish_many(jobs, counted_on=True)  # as first sent: starts 30 and 40, held back
        assert fair_share.clock(QUEUE).earliest_held == 30
        with ThreadPoolExecutor(max_workers=1) as other:
            assert other.submit(_release_elsewhere).result() == 0  # the holds are not committed

    # Committed: the worker's next look finds the note, so the held jobs are not stranded.
    assert fair_share.clock(QUEUE).earliest_held == 30
    assert release_held(SERVICE, "batch") == 2
    assert ready() == 1


def test_a_release_that_finds_the_held_rows_locked_leaves_them_noted(served_service, make_tenant):
    # Another release has them locked (SKIP LOCKED hides them) and may not take them all:
    # were the note cleared, what it leaves would wait for the sweeper, not the next run.
    from concurrent.futures import ThreadPoolExecutor

    from django.db import transaction

    tenant, _ = make_tenant("locked")
    submit(tenant, 10)  # starts 0 to 20 go out, 30 to 90 are held
    assert fair_share.clock(QUEUE).earliest_held == 30

    with transaction.atomic():
        assert len(Job.objects.held_back().select_for_update()) == 7
        with ThreadPoolExecutor(max_workers=1) as other:
            assert other.submit(_release_elsewhere).result() == 0

    assert fair_share.clock(QUEUE).earliest_held == 30


def test_a_hold_committed_after_the_workers_went_idle_is_released_by_its_sender(
    served_service, make_tenant
):
    tenant, _ = make_tenant("late")
    submit(tenant, 1)  # start 0 goes out and is taken
    purge_test_queues([QUEUE])
    fair_share.advance({QUEUE: None}, going_idle=True)  # the worker's run ended: nothing left

    submit(tenant, 3)  # starts 10 to 30: a quantum or more ahead of V, held back

    # Nobody would take from the queue to release them (the sweeper's backstop is slow):
    # the submission released them itself.
    assert not Job.objects.held_back().exists()
    assert ready() >= 1
    assert Job.objects.filter(service__name=SERVICE, published_at__isnull=False).count() == 4
