"""GET /api/v1/jobs:batchGet: many of a tenant's jobs in one read, through the web server as
`make web` runs it, and renq_client's results() reading a list of jobs with it."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
import requests
from django.db import connection

from inference.models import Job
from renq_client import RenqClient

pytestmark = pytest.mark.django_db(transaction=True)


def _call(method: str, url: str, key: str, path: str, body=None, params=None):
    return requests.request(
        method,
        f"{url}/api/v1/{path}",
        json=body,
        params=params,
        headers={"Authorization": f"Bearer {key}"},
        timeout=40,
    )


def _queued_jobs(url: str, key: str, service: str, count: int) -> list[str]:
    items = [{"service": service, "input": {"texts": [f"text {i}"]}} for i in range(count)]
    accepted = _call("POST", url, key, "jobs", items)
    assert accepted.status_code == 202
    return [item["id"] for item in accepted.json()["jobs"]]


def test_a_batch_read_answers_each_named_job_in_order(front_door_url, unserved, tenant_key):
    first, second, third = _queued_jobs(front_door_url, tenant_key, unserved, 3)
    _call("POST", front_door_url, tenant_key, f"jobs/{second}/cancel")

    answer = _call(
        "GET", front_door_url, tenant_key, "jobs:batchGet", params={"id": [third, second, first]}
    )

    assert answer.status_code == 200
    jobs = answer.json()["jobs"]
    assert [job["id"] for job in jobs] == [third, second, first]
    assert [job["status"] for job in jobs] == ["queued", "cancelled", "queued"]
    assert [job["input"] for job in jobs] == [{"texts": [f"text {i}"]} for i in (2, 1, 0)]
    assert all("result" in job and "wait" not in job for job in jobs)


def test_a_waiting_batch_read_answers_once_one_job_is_final(front_door_url, unserved, tenant_key):
    first, second = _queued_jobs(front_door_url, tenant_key, unserved, 2)
    cancel = threading.Timer(
        0.5, _call, ("POST", front_door_url, tenant_key, f"jobs/{second}/cancel")
    )
    cancel.start()
    started = time.monotonic()
    answer = _call(
        "GET",
        front_door_url,
        tenant_key,
        "jobs:batchGet",
        params={"id": [first, second], "wait": "30"},
    )
    waited_s = time.monotonic() - started
    cancel.join()

    assert answer.status_code == 200
    assert [job["status"] for job in answer.json()["jobs"]] == ["queued", "cancelled"]
    assert waited_s < 25  # the job's end ended the wait, not the wait's length


def test_a_wait_that_runs_out_answers_with_the_jobs_as_they_are(
    front_door_url, unserved, tenant_key
):
    (job_id,) = _queued_jobs(front_door_url, tenant_key, unserved, 1)
    answer = _call(
        "GET", front_door_url, tenant_key, "jobs:batchGet", params={"id": job_id, "wait": "0.3"}
    )
    assert answer.status_code == 200
    assert [job["status"] for job in answer.json()["jobs"]] == ["queued"]


def test_another_tenants_job_is_a_404_naming_it(front_door_url, unserved, tenant_key, make_tenant):
    (mine,) = _queued_jobs(front_door_url, tenant_key, unserved, 1)
    _, other_key = make_tenant("other-reader")
    (theirs,) = _queued_jobs(front_door_url, other_key, unserved, 1)

    answer = _call(
        "GET", front_door_url, tenant_key, "jobs:batchGet", params={"id": [mine, theirs]}
    )
    assert answer.status_code == 404
    assert theirs in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    "params, field",
    [
        ({}, "id"),
        ({"id": "not-a-job"}, "id"),
        ({"id": ["00000000-0000-4000-8000-000000000000"] * 101}, "id"),
        ({"id": "00000000-0000-4000-8000-000000000000", "wait": "0"}, "wait"),
        ({"id": "00000000-0000-4000-8000-000000000000", "ids": "x"}, "ids"),
    ],
)
def test_a_bad_batch_read_is_a_400_naming_the_parameter(front_door_url, tenant_key, params, field):
    answer = _call("GET", front_door_url, tenant_key, "jobs:batchGet", params=params)
    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == [field]


def test_results_reads_a_list_of_jobs_a_hundred_per_request(front_door_url, unserved, tenant_key):
    job_ids = _queued_jobs(front_door_url, tenant_key, unserved, 150)

    def cancel_all() -> None:
        # One state change for all, as a worker's batch ends: one notification round.
        Job.objects.filter(pk__in=job_ids).cancel()
        connection.close()

    canceller = threading.Timer(0.5, cancel_all)
    canceller.start()
    client = RenqClient(front_door_url, tenant_key)
    jobs = list(client.results(job_ids, timeout_s=60))
    canceller.join()

    assert sorted(job["id"] for job in jobs) == sorted(job_ids)
    assert {job["status"] for job in jobs} == {"cancelled"}
    # Two reads that find none final, one that waits for the cancel and one more for the
    # other fifty: a GET per job would be 150 for the first round alone.
    assert client.stats.requests <= 6


def test_the_django_test_client_waits_on_a_batch_read_too(api, unserved):
    accepted = api.post(
        "/api/v1/jobs", {"service": unserved, "input": {"texts": ["x"]}}, format="json"
    )
    answer = api.get(f"/api/v1/jobs:batchGet?id={accepted.json()['id']}&wait=0.2")
    assert answer.status_code == 200
    assert [job["status"] for job in answer.json()["jobs"]] == ["queued"]


def test_results_finds_a_job_that_finishes_out_of_order(front_door_url, unserved, tenant_key):
    job_ids = _queued_jobs(front_door_url, tenant_key, unserved, 150)
    late = job_ids[140:]  # in the second hundred, behind a first hundred that never finishes
    canceller = threading.Timer(
        0.5, lambda: [_call("POST", front_door_url, tenant_key, f"jobs/{i}/cancel") for i in late]
    )
    canceller.start()
    client = RenqClient(front_door_url, tenant_key)
    started = time.monotonic()
    found = list(itertools.islice(client.results(job_ids, timeout_s=60), len(late)))
    canceller.join()

    assert sorted(job["id"] for job in found) == sorted(late)
    assert time.monotonic() - started < 30  # a sweep and a waiting read: about 10 s at most


def test_a_batch_read_costs_the_same_queries_for_100_jobs_as_for_one(
    api, unserved, django_assert_max_num_queries
):
    items = [{"service": unserved, "input": {"texts": [f"t {i}"]}} for i in range(100)]
    ids = [job["id"] for job in api.post("/api/v1/jobs", items, format="json").json()["jobs"]]
    api.post(f"/api/v1/jobs/{ids[0]}/cancel")
    with django_assert_max_num_queries(3) as one:
        assert api.get(f"/api/v1/jobs:batchGet?id={ids[0]}").status_code == 200
    query = "&".join(f"id={job_id}" for job_id in ids)
    with django_assert_max_num_queries(len(one.captured_queries)):
        jobs = api.get(f"/api/v1/jobs:batchGet?{query}").json()["jobs"]
    assert len(jobs) == 100 and jobs[0]["status"] == "cancelled"


def test_bulk_jobs_progress_costs_one_count_per_page(
    api, make_service, django_assert_max_num_queries
):
    make_service("noop", name="bulky-progress")
    bulk = {"service": "bulky-progress", "input": {"texts": [f"t {i}" for i in range(3)]}}
    ids = [api.post("/api/v1/jobs/bulk", bulk, format="json").json()["id"] for _ in range(5)]
    with django_assert_max_num_queries(10) as one:
        assert api.get(f"/api/v1/jobs:batchGet?id={ids[0]}").status_code == 200
        assert api.get("/api/v1/jobs?limit=1").status_code == 200
    query = "&".join(f"id={job_id}" for job_id in ids)
    with django_assert_max_num_queries(len(one.captured_queries)):
        jobs = api.get(f"/api/v1/jobs:batchGet?{query}").json()["jobs"]
        page = api.get("/api/v1/jobs?limit=5").json()["results"]

    pieces = Job.objects.get(pk=ids[0]).pieces.count()
    expected = {"total": pieces, "done": 0, "failed": 0}
    assert pieces >= 1
    assert [job["progress"] for job in jobs] == [expected] * 5
    assert [job["progress"] for job in page] == [expected] * 5


def test_results_yields_the_last_jobs_as_they_finish(front_door_url, unserved, tenant_key):
    first, second, third = _queued_jobs(front_door_url, tenant_key, unserved, 3)
    cancels = [
        threading.Timer(delay_s, _call, ("POST", front_door_url, tenant_key, f"jobs/{job}/cancel"))
        for delay_s, job in ((0.3, first), (1.0, second), (1.5, third))
    ]
    for cancel in cancels:
        cancel.start()
    client = RenqClient(front_door_url, tenant_key)
    started = time.monotonic()
    # Rounds a poll_s apart would find the second job 30 s in.
    found = [
        (job["id"], time.monotonic() - started)
        for job in client.results([first, second, third], poll_s=30)
    ]
    for cancel in cancels:
        cancel.join()

    assert [job_id for job_id, _ in found] == [first, second, third]
    assert found[-1][1] < 15


def test_without_redis_a_waiting_batch_read_tries_one_subscription_and_still_answers(
    api, unserved, settings, caplog
):
    items = [{"service": unserved, "input": {"texts": [f"t {i}"]}} for i in range(3)]
    ids = [job["id"] for job in api.post("/api/v1/jobs", items, format="json").json()["jobs"]]
    settings.RENQ_REDIS_URL = "redis://127.0.0.1:1/0"  # the waiting read's Redis: nobody there
    query = "&".join(f"id={job_id}" for job_id in ids)
    with caplog.at_level(logging.WARNING, logger="inference.delivery.waiting"):
        answer = api.get(f"/api/v1/jobs:batchGet?{query}&wait=0.3")

    assert answer.status_code == 200
    assert [job["status"] for job in answer.json()["jobs"]] == ["queued"] * 3
    assert len([r for r in caplog.records if "no Redis subscription" in r.message]) == 1
