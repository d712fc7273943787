"""A realtime submission offers its input to an idle worker of its queue before it commits."""

from __future__ import annotations

import json

import pytest

from inference.dispatch.head_start import offer_key, take_offer
from inference.dispatch.publishing import MAX_CARRIED_INPUT_BYTES
from inference.dispatch.queues import service_queues, tier_queue
from inference.intake.submission import submit_job
from inference.models import Job
from renq_site.shared_redis import shared_redis
from tests.conftest import purge_test_queues

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_single_realtime_job_is_offered_with_its_input_and_no_other_is(
    make_tenant, make_service
):
    make_service("noop", name="offered")
    purge_test_queues(service_queues("offered"))
    queue = tier_queue("offered", "realtime")
    client = shared_redis()
    client.delete(offer_key(queue), offer_key(tier_queue("offered", "batch")))
    tenant, _ = make_tenant()
    small = {"texts": ["hello"]}

    job = submit_job(tenant=tenant, service_name="offered", payload=small, priority="realtime")
    for payload, priority in (
        ({"texts": ["x" * MAX_CARRIED_INPUT_BYTES]}, "realtime"),  # too large to carry
        (small, "batch"),
    ):
        submit_job(tenant=tenant, service_name="offered", payload=payload, priority=priority)

    offer = take_offer(client, [queue], timeout_s=1)
    assert offer is not None
    assert (offer.job_id, offer.queue, json.loads(offer.carried)) == (str(job.pk), queue, small)
    assert 0 <= offer.age_s < 60
    assert take_offer(client, [queue, tier_queue("offered", "batch")], timeout_s=1) is None
    # The offer is a head start, not the job: it was committed and published as any other.
    assert Job.objects.filter(pk=job.pk, published_at__isnull=False).exists()
