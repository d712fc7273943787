"""Finished jobs are announced to whoever waits for them."""

from __future__ import annotations

import time
import uuid

from inference.delivery.waiting import job_channel, notify_finished
from renq_site.shared_redis import shared_redis


def _heard(pubsub, timeout_s: float = 0.5) -> set[str]:
    channels: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            channels.add(message["channel"].decode())
    return channels


def test_each_finished_job_of_a_batch_is_announced_on_its_own_channel():
    waited, other = str(uuid.uuid4()), str(uuid.uuid4())
    pubsub = shared_redis().pubsub()
    pubsub.subscribe(job_channel(waited))
    pubsub.get_message(timeout=2)  # the subscription's confirmation
    notify_finished([other, waited, str(uuid.uuid4())])
    assert _heard(pubsub) == {job_channel(waited)}
    # Redis lost its scripts (a restart): the next batch is still announced.
    shared_redis().script_flush()
    notify_finished([waited])
    assert _heard(pubsub) == {job_channel(waited)}
    pubsub.close()
