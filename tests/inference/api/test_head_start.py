"""A REST `POST /api/v1/jobs?wait=` of a realtime job offers its head start from the event loop,
before the request takes its lane, once its process has the key and the service cached; the
submit then offers nothing more. A POST that does not wait offers it from its submit."""

from __future__ import annotations

import json

import pytest
import requests

from inference.dispatch.head_start import offer_key
from inference.dispatch.queues import tier_queue
from inference.models import Job
from renq_site.shared_redis import shared_redis
from tests.inference.openai_api.test_head_start import offers_in_redis

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_realtime_post_that_waits_is_offered_once_and_before_its_submit_once_cached(
    front_door_url, tenant_key, make_service
):
    # No worker consumes it: the waits end at 202, the offers stay in Redis to be read.
    service = make_service("embedding", name="rest-offered-early")
    queue = tier_queue(service.name, "realtime")
    shared_redis().delete(offer_key(queue))
    offered_before_submit = []
    for text, wait in (("fills the caches", True), ("offered from them", True), ("no", False)):
        answer = requests.post(
            f"{front_door_url}/api/v1/jobs" + ("?wait=0.2" if wait else ""),
            json={"service": service.name, "priority": "realtime", "input": {"texts": [text]}},
            headers={"Authorization": f"Bearer {tenant_key}"},
            timeout=20,
        )
        assert answer.status_code == 202, answer.text
        job = Job.objects.get(pk=answer.json()["id"])
        offers = offers_in_redis(queue)
        assert [offer.job_id for offer in offers] == [str(job.pk)]
        assert json.loads(offers[0].carried) == job.input == {"texts": [text]}
        offered_before_submit.append(offers[0].offered_at < job.created_at.timestamp())
    # The first request found nothing cached: its submit offered it, after creating it; a
    # POST that does not wait is offered by its submit.
    assert offered_before_submit == [False, True, False]
