"""renq_client's cancel against a live server: one POST to /jobs/<id>/cancel, the job back."""

from __future__ import annotations

import pytest

from renq_client import RenqClient, RenqError

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_posts_to_the_cancel_path_and_returns_the_job(
    live_server, make_tenant, make_service
):
    make_service("embedding", name="clientcancel")  # no worker: the job stays queued
    _, key = make_tenant("canceller")
    client = RenqClient(live_server.url, key)
    job_id = client.submit("clientcancel", {"texts": ["hello"]})["id"]
    sent: list[tuple[str, str]] = []
    client.session.hooks["response"].append(
        lambda response, **_: sent.append((response.request.method, response.request.url))
    )
    job = client.cancel(job_id)
    assert job["id"] == job_id and job["status"] == "cancelled"
    assert sent == [("POST", f"{live_server.url}/api/v1/jobs/{job_id}/cancel")]
    assert client.get(job_id)["status"] == "cancelled"
    with pytest.raises(RenqError) as caught:
        client.cancel(job_id)
    assert caught.value.status == 409
