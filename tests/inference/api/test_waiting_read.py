"""GET /api/v1/jobs/<id>?wait=<s>: a long poll of a submitted job, through the web server as
`make web` runs it: the read answers once the job is final, or with the job as it is when the
wait runs out."""

from __future__ import annotations

import threading
import time

import pytest
import requests

pytestmark = pytest.mark.django_db(transaction=True)


def _call(method: str, url: str, key: str, path: str, body=None) -> requests.Response:
    return requests.request(
        method,
        f"{url}/api/v1/{path}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=40,
    )


def _queued_job(url: str, key: str, service: str) -> str:
    accepted = _call("POST", url, key, "jobs", {"service": service, "input": {"texts": ["x"]}})
    assert accepted.status_code == 202
    return accepted.json()["id"]


def test_a_waiting_read_answers_once_its_job_is_final(front_door_url, unserved, tenant_key):
    job_id = _queued_job(front_door_url, tenant_key, unserved)
    # Another client cancels it while the read waits.
    cancel = threading.Timer(
        0.5, _call, ("POST", front_door_url, tenant_key, f"jobs/{job_id}/cancel")
    )
    cancel.start()
    started = time.monotonic()
    answer = _call("GET", front_door_url, tenant_key, f"jobs/{job_id}?wait=30")
    waited_s = time.monotonic() - started
    cancel.join()

    assert answer.status_code == 200
    assert answer.json()["status"] == "cancelled"
    assert waited_s < 25  # the job's end ended the wait, not the wait's length


def test_a_wait_that_runs_out_answers_with_the_job_as_it_is(front_door_url, unserved, tenant_key):
    job_id = _queued_job(front_door_url, tenant_key, unserved)
    answer = _call("GET", front_door_url, tenant_key, f"jobs/{job_id}?wait=0.3")

    assert answer.status_code == 200
    page = answer.json()
    assert page["status"] == "queued"
    assert page["wait"]["position"] == 0  # the page a read without a wait shows


def test_a_final_job_is_answered_at_once_and_a_missing_one_is_404(
    front_door_url, unserved, tenant_key
):
    job_id = _queued_job(front_door_url, tenant_key, unserved)
    _call("POST", front_door_url, tenant_key, f"jobs/{job_id}/cancel")
    started = time.monotonic()
    answer = _call("GET", front_door_url, tenant_key, f"jobs/{job_id}?wait=30")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"
    assert time.monotonic() - started < 25

    missing = "00000000-0000-4000-8000-000000000000"
    assert _call("GET", front_door_url, tenant_key, f"jobs/{missing}?wait=30").status_code == 404


@pytest.mark.parametrize("query", ["?wait=0", "?wait=61", "?wait=soon"])
def test_a_bad_wait_on_a_read_is_a_400_naming_it(front_door_url, unserved, tenant_key, query):
    job_id = _queued_job(front_door_url, tenant_key, unserved)
    answer = _call("GET", front_door_url, tenant_key, f"jobs/{job_id}{query}")
    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["wait"]


def test_the_django_test_client_waits_on_a_read_too(api, unserved):
    accepted = api.post(
        "/api/v1/jobs", {"service": unserved, "input": {"texts": ["x"]}}, format="json"
    )
    answer = api.get(f"/api/v1/jobs/{accepted.json()['id']}?wait=0.2")
    assert answer.status_code == 200
    assert answer.json()["status"] == "queued"
