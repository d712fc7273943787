"""The wait a queued job is promised, measured against a real worker: jobs are queued while
the worker serves, each job's predicted start is read the moment it is accepted (as a client
polling GET /api/v1/jobs/<id> sees it), and compared with when the worker really started it.
Two tenants share the tier, one flooding and one trickling, so the fair share reorders the
line as it is predicted.

A timing measurement, so it runs in `make bench` (RENQ_MEASURE=1), not in `make test`: its
bounds are sanity checks on the figures it prints."""

from __future__ import annotations

import os
from datetime import datetime

import pytest

from inference.dispatch.queue_position import explain_wait
from inference.dispatch.queues import service_queues
from inference.intake.submission import submit_job
from renq_site.shared_redis import shared_redis
from routing.stats import throughput_key
from tests.conftest import WorkerProcess, purge_test_queues, wait_for_job

pytestmark = pytest.mark.skipif(
    os.environ.get("RENQ_MEASURE") != "1", reason="a timing measurement: make bench runs it"
)

SERVICE = "wait-eta"
# Long enough per job that the stack's own cost per job is a small part of it.
SLEEP_MS = 150
# Bounds on the median error, generous fractions of the whole run (32 jobs, about 5 s): the
# machine running the suite may be busy with other work.
P50_BOUND_S = 1.5
QUIET_P50_BOUND_S = 0.6


def _fresh(make_service):
    service = make_service("noop", name=SERVICE, batch_size=1, batch_timeout=0.001)
    purge_test_queues(service_queues(SERVICE))
    client = shared_redis()
    client.delete(throughput_key(SERVICE))
    for pattern in (f"renq:cost:{SERVICE}:*", f"renq:fair:*{SERVICE}*"):
        for key in client.scan_iter(pattern):
            client.delete(key)
    return service


def _submit(tenant):
    return submit_job(
        tenant=tenant,
        service_name=SERVICE,
        payload={"texts": ["x" * 40], "sleep_ms": SLEEP_MS},
        priority="batch",
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_predicted_start_is_close_to_the_real_start(make_tenant, make_service):
    _fresh(make_service)
    flooder, _ = make_tenant("eta-flooder")
    quiet, _ = make_tenant("eta-quiet")
    worker = WorkerProcess(services=(SERVICE,), name="g-eta")
    try:
        # Warm up: the worker's measured throughput exists before anything is predicted.
        for job in [_submit(flooder) for _ in range(5)]:
            wait_for_job(job.pk, timeout_s=60)
        predicted = {}
        for i in range(32):
            tenant = quiet if i % 4 == 3 else flooder
            job = _submit(tenant)
            wait = explain_wait(job)
            if wait is not None:  # not already taken by the worker
                predicted[job.pk] = (tenant.name, datetime.fromisoformat(wait["predicted_start"]))
        errors = {"eta-flooder": [], "eta-quiet": []}
        for pk, (name, start) in predicted.items():
            started = wait_for_job(pk, timeout_s=120).started_at
            errors[name].append(abs((started - start).total_seconds()))
    finally:
        worker.stop()
    every = sorted(errors["eta-flooder"] + errors["eta-quiet"])
    assert len(every) >= 20, len(every)
    p50, p90 = _percentile(every, 0.5), _percentile(every, 0.9)
    quiet_p50 = _percentile(errors["eta-quiet"], 0.5)
    print(
        f"wait prediction: n={len(every)} p50={p50:.3f}s p90={p90:.3f}s; quiet tenant "
        f"p50={quiet_p50:.3f}s, flooding tenant p50={_percentile(errors['eta-flooder'], 0.5):.3f}s"
    )
    # The flood's jobs are predicted from the line as it is; the quiet tenant's later jobs,
    # still to come, then pass them by their fair share. Nothing can pass the quiet tenant's
    # jobs but its share of the flood, so their prediction is the sharper one.
    assert p50 <= P50_BOUND_S, (p50, p90, errors)
    assert quiet_p50 <= QUIET_P50_BOUND_S, (quiet_p50, errors)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]
