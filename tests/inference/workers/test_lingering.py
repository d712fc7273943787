"""A run that found nothing more to pull lingers for the next message on its own channel
(inference.workers.gpu.runner): what arrives meanwhile runs there and is acked there, and
nothing that arrives after it stops is kept from the queue."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from inference.dispatch.publishing import publish
from inference.jobs.tiers import TIER_ORDER, Tier
from inference.models import Job, JobStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _job(tenant, service, tier: str = "realtime") -> Job:
    return Job.objects.create(
        tenant=tenant,
        service=service,
        tier=tier,
        message_priority=2,
        input={"texts": [f"{service.name} {tier} {time.time()}"]},
    )


def _ready_messages(queue: str) -> int:
    from renq_site.celery import app

    with app.connection_for_write() as connection:
        return connection.default_channel.queue_declare(queue=queue, passive=True).message_count


def _all_tiers(_service_name: str) -> list[Tier]:
    return list(TIER_ORDER)


def test_a_message_sent_while_the_run_lingers_runs_there_and_is_acked(
    make_tenant, make_service, settings
):
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.workers.gpu.runner import BatchRunner
    from tests.conftest import in_process_readers, purge_test_queues

    settings.RENQ_WORKER_LINGER_S = 2.0
    service = make_service("noop", name="lingering")
    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    seed, later = _job(tenant, service), _job(tenant, service, tier="batch")
    sender = threading.Timer(0.3, publish, args=(later,))

    with in_process_readers(service.name) as readers:
        sender.start()
        report = BatchRunner(readers, lingers_on=_all_tiers).run(
            [str(seed.pk)], seed_redelivered=False, seed_tier="realtime"
        )
        sender.join()
        readers.close_all()  # a message left unacked on the reader's channel comes back now
        left = _ready_messages(tier_queue(service.name, Tier.BATCH))

    assert Job.objects.get(pk=later.pk).status == JobStatus.SUCCEEDED
    assert report["ran"] == 2, report
    assert left == 0


def test_a_run_stops_lingering_and_leaves_later_messages_in_their_queue(
    make_tenant, make_service, settings
):
    from inference.dispatch.queues import service_queues, tier_queue
    from inference.workers.gpu.runner import BatchRunner
    from tests.conftest import in_process_readers, purge_test_queues

    settings.RENQ_WORKER_LINGER_S = 0.2
    service = make_service("noop", name="lingering-ends")
    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    seed, later = _job(tenant, service), _job(tenant, service)

    with in_process_readers(service.name) as readers:
        started = time.monotonic()
        BatchRunner(readers, lingers_on=_all_tiers).run(
            [str(seed.pk)], seed_redelivered=False, seed_tier="realtime"
        )
        returned_after = time.monotonic() - started
        # The reader's channel is still open: had a consumer outlived the linger, it would
        # take this message off the queue and hold it there.
        publish(later)
        time.sleep(0.3)
        ready = _ready_messages(tier_queue(service.name, Tier.REALTIME))

    assert Job.objects.get(pk=seed.pk).status == JobStatus.SUCCEEDED
    assert returned_after < 10, "the run did not stop lingering"
    assert ready == 1
    assert Job.objects.get(pk=later.pk).status == JobStatus.QUEUED


def test_only_a_pool_process_serving_one_service_alone_lingers(monkeypatch):
    from inference.dispatch.queues import service_queues
    from inference.workers.gpu import runner

    consumed: dict[str, object] = {}
    queues = SimpleNamespace(consume_from=consumed)
    worker_app = SimpleNamespace(amqp=SimpleNamespace(queues=queues))
    monkeypatch.setattr(runner, "app", worker_app)
    pool_process = SimpleNamespace(name="ForkPoolWorker-1")
    monkeypatch.setattr(runner, "current_process", lambda: pool_process)

    consumed.update(dict.fromkeys(service_queues("alone")))
    assert runner.consumed_tiers("alone") == list(TIER_ORDER)

    # Another service's messages would wait behind the lingering task's unacked message.
    consumed.update(dict.fromkeys(service_queues("other")))
    assert runner.consumed_tiers("alone") == []

    # A solo or thread pool runs tasks in Celery's own process.
    consumed.clear()
    consumed.update(dict.fromkeys(service_queues("alone")))
    monkeypatch.setattr(runner, "current_process", lambda: SimpleNamespace(name="MainProcess"))
    assert runner.consumed_tiers("alone") == []
