"""The front door offers a realtime job's head start from its event loop, before the job's
submission has even reached the database thread, once its process has the key and the service
cached; the submit then offers nothing more."""

from __future__ import annotations

import json

import pytest
import requests

from inference.dispatch.head_start import Offer, offer_key, take_offer
from inference.dispatch.queues import tier_queue
from inference.models import Job
from renq_site.shared_redis import shared_redis

pytestmark = pytest.mark.django_db(transaction=True)


def offers_in_redis(queue: str) -> list[Offer]:
    """The offers waiting for `queue`'s workers, taken."""
    offers = []
    while (offer := take_offer(shared_redis(), [queue], timeout_s=1)) is not None:
        offers.append(offer)
    return offers


def test_a_realtime_request_is_offered_once_and_before_its_submit_once_cached(
    front_door_url, tenant_key, make_service
):
    # No worker consumes it: the requests time out, their offers stay in Redis to be read.
    service = make_service("embedding", name="offered-early", total_timeout=0.3)
    queue = tier_queue(service.name, "realtime")
    shared_redis().delete(offer_key(queue))
    offered_before_submit = []
    for text in ("fills the caches", "offered from them", "and again"):
        answer = requests.post(
            f"{front_door_url}/v1/embeddings",
            json={"model": service.name, "input": text},
            headers={"Authorization": f"Bearer {tenant_key}", "X-Renq-Priority": "realtime"},
            timeout=20,
        )
        assert answer.status_code == 504, answer.text
        job = Job.objects.get(pk=answer.headers["X-Renq-Job-Id"])
        offers = offers_in_redis(queue)
        assert [offer.job_id for offer in offers] == [str(job.pk)]
        assert json.loads(offers[0].carried) == job.input == {"texts": [text]}
        offered_before_submit.append(offers[0].offered_at < job.created_at.timestamp())
    # The first request found nothing cached: its submit offered it, after creating it.
    assert offered_before_submit == [False, True, True]
