"""A web process waits for its requests' jobs on one Redis connection, and a success arrives
with its outcome."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import numpy as np

from inference.delivery.waiting import (
    HINT,
    MAX_NOTICE_BYTES,
    Notice,
    job_waiters,
    notice_of,
    notify_finished,
    wait_for_final_job,
)
from inference.jobs.transitions import Outcome
from inference.jobs.vectors import VECTORS_KEY
from inference.models import Job
from renq_site.shared_redis import shared_redis


def _outcome(result: dict) -> Outcome:
    return Outcome(
        job=Job(id=uuid.uuid4()),
        result=result,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        inference_ms=3.5,
        batch_size=2,
        tokens=7,
        backend="local-embedding",
    )


def test_a_notice_carries_the_stored_outcome_vectors_as_float32_bytes():
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3).tolist()
    outcome = _outcome({VECTORS_KEY: vectors, "usage": {"tokens": 7}})
    notice = Notice.decode(notice_of(outcome, datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)))
    assert notice.result == {"usage": {"tokens": 7}, "dim": 3, "count": 2}
    assert np.frombuffer(notice.vectors, dtype=np.float32).tolist() == [0, 1, 2, 3, 4, 5]
    assert (notice.inference_ms, notice.batch_size, notice.tokens) == (3.5, 2, 7)
    assert notice.backend == "local-embedding"
    assert notice.finished_at - notice.started_at == (
        datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC) - datetime(2026, 1, 1, tzinfo=UTC)
    )


def test_a_large_outcome_is_announced_as_a_hint_to_read_the_row():
    outcome = _outcome({"text": "x" * (MAX_NOTICE_BYTES + 1)})
    assert notice_of(outcome, datetime.now(UTC)) == HINT
    assert Notice.decode(HINT) is None


def test_many_waiters_share_one_connection_and_each_hears_only_its_job():
    job_ids = [uuid.uuid4() for _ in range(40)]

    async def scenario() -> tuple[list, int]:
        subscriptions = [await job_waiters().subscribe(job_id) for job_id in job_ids]
        assert all(s.confirmed for s in subscriptions)
        # The connections holding these channels (others, of other processes, may come and go).
        pubsub_clients = sum(
            int(client["sub"]) >= len(job_ids)
            for client in shared_redis().client_list(_type="pubsub")
        )
        # Every other job succeeds (announced with its outcome), the rest get a bare hint.
        stored = [_outcome({"text": f"answer {i}"}) for i in range(0, len(job_ids), 2)]
        for outcome, job_id in zip(stored, job_ids[::2], strict=True):
            outcome.job = Job(id=job_id)
        await asyncio.to_thread(notify_finished, job_ids, stored)

        async def read_row() -> str:
            return "read the row"

        answers = await asyncio.gather(
            *(
                wait_for_final_job(
                    job_id,
                    read_row,
                    timeout_s=5,
                    subscription=subscription,
                    from_notice=lambda notice: notice.result["text"],
                )
                for job_id, subscription in zip(job_ids, subscriptions, strict=True)
            )
        )
        return answers, pubsub_clients

    answers, pubsub_clients = asyncio.run(scenario())
    assert pubsub_clients == 1
    assert answers[::2] == [f"answer {i}" for i in range(0, len(job_ids), 2)]
    assert answers[1::2] == ["read the row"] * (len(job_ids) // 2)


def test_a_waiter_whose_job_is_never_announced_re_reads_and_times_out():
    reads = []

    async def read_row():
        reads.append(1)
        return None

    async def scenario():
        return await wait_for_final_job(uuid.uuid4(), read_row, timeout_s=0.3)

    assert asyncio.run(scenario()) is None
    assert len(reads) >= 2  # once after subscribing, once when the wait ran out


def test_a_waiter_takes_the_answer_sent_before_its_store():
    from inference.delivery.waiting import answer_before_store, subscribe

    outcome = _outcome({"scores": [0.5]})

    async def wait() -> list:
        subscription = await subscribe(outcome.job.pk)
        waiting = asyncio.create_task(
            wait_for_final_job(
                outcome.job.pk,
                read_final_job=lambda: asyncio.sleep(0),  # never final when read
                timeout_s=2,
                subscription=subscription,
                from_notice=lambda notice: (notice.stored, notice.result),
            )
        )
        await asyncio.to_thread(answer_before_store, [outcome])
        await asyncio.sleep(0.1)
        return [waiting.done(), await waiting]

    assert asyncio.run(wait()) == [True, (False, {"scores": [0.5]})]


def test_a_job_of_this_process_is_heard_with_no_subscribe_of_its_own():
    from inference.delivery.waiting import job_channel, new_job_id, subscribe

    job_id = new_job_id()
    outcome = _outcome({"text": "answer"})
    outcome.job = Job(id=job_id)

    async def scenario():
        subscription = await subscribe(job_id)
        listeners = dict(shared_redis().pubsub_numsub(job_channel(job_id)))
        await asyncio.to_thread(notify_finished, [job_id], [outcome])

        async def read_row():
            return "read the row"

        answer = await wait_for_final_job(
            job_id,
            read_row,
            timeout_s=5,
            subscription=subscription,
            from_notice=lambda notice: notice.result["text"],
        )
        return subscription.confirmed, listeners[job_channel(job_id).encode()], answer

    assert asyncio.run(scenario()) == (True, 0, "answer")
    assert job_id.version == 4 and str(job_id)[:8] == str(new_job_id())[:8]


def test_a_notice_that_comes_before_its_waiter_subscribes_is_kept_for_it():
    """A REST ?wait= subscribes after its submit returns: a job finished meanwhile is heard."""
    from inference.delivery.waiting import new_job_id, subscribe

    job_id = new_job_id()
    outcome = _outcome({"text": "answer"})
    outcome.job = Job(id=job_id)

    async def scenario():
        await (await subscribe(new_job_id())).close()  # the process listens
        submitted_at = time.monotonic()
        await asyncio.to_thread(notify_finished, [job_id], [outcome])
        await asyncio.sleep(0.2)  # announced before anyone subscribed
        subscription = await subscribe(job_id, since=submitted_at)

        async def read_row():
            return "read the row"

        return subscription.confirmed, await wait_for_final_job(
            job_id,
            read_row,
            timeout_s=2,
            subscription=subscription,
            from_notice=lambda notice: notice.result["text"],
        )

    assert asyncio.run(scenario()) == (True, "answer")


def test_a_waiter_that_was_not_listening_when_its_job_was_submitted_reads_it_first():
    from inference.delivery.waiting import new_job_id, subscribe

    async def scenario():
        submitted_at = time.monotonic()  # before this event loop's waiters listen
        subscription = await subscribe(new_job_id(), since=submitted_at)
        await subscription.close()
        return subscription.confirmed

    assert asyncio.run(scenario()) is False
