"""Error paths answer in OpenAI's shape, so the SDK raises the class its users catch."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta

import openai
import pytest
import requests
from django.utils import timezone

from inference.intake.submission import submit_job
from inference.models import Job, JobStatus, Service, Tenant
from inference.workers.gpu.intake import note_claim
from inference.workers.gpu.report import BatchReport

pytestmark = pytest.mark.django_db(transaction=True)


def assert_openai_shape(error: openai.APIStatusError, status: int, code: str | None) -> dict:
    assert error.status_code == status
    body = error.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] == code and body["message"]
    return body


def test_bad_key_is_401(client, front_door_url):
    from openai import OpenAI

    stranger = OpenAI(base_url=f"{front_door_url}/v1", api_key="rq_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        stranger.embeddings.create(model="embedding", input="hi")
    assert_openai_shape(caught.value, 401, "invalid_api_key")
    response = requests.get(f"{front_door_url}/v1/models", timeout=5)
    assert response.status_code == 401


def test_a_database_connection_already_closed_is_503_not_500():
    # Django's InterfaceError (a connection a database restart closed) is no DatabaseError.
    from django.db import InterfaceError
    from django.test import RequestFactory

    from inference.openai_api.views import openai_view

    @openai_view("POST")
    async def view(request):
        raise InterfaceError("connection already closed")

    response = asyncio.run(view(RequestFactory().post("/v1/embeddings")))
    assert response.status_code == 503 and response["Retry-After"]


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="no-such-model", input="hi")
    body = assert_openai_shape(caught.value, 404, "model_not_found")
    assert body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_a_model_of_the_wrong_kind_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="llm", input="hi")
    assert_openai_shape(caught.value, 400, "model_not_supported")


def test_bad_input_names_the_request_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedding", input=["fine", "x" * 20_001])
    body = assert_openai_shape(caught.value, 400, "invalid_value")
    assert body["param"] == "input[1]"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="llm", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert assert_openai_shape(caught.value, 400, None)["param"] == "n"
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedding", input="hi", dimensions=0)
    assert assert_openai_shape(caught.value, 400, None)["param"] == "dimensions"


def test_dimensions_past_the_models_size_are_refused_before_a_job_is_made(
    client, front_door_url, tenant_key, services
):
    from inference.scheduling.embedding_dims import note_embedding_dim

    note_embedding_dim(services["embedding"].model_ref, 384)  # as a worker's warm-up notes it
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedding", input="hi", dimensions=385)
    body = assert_openai_shape(caught.value, 400, None)
    assert body["param"] == "dimensions" and "the model's 384" in body["message"]
    cohere = requests.post(
        f"{front_door_url}/v2/embed",
        json={
            "model": "embedding",
            "texts": ["hi"],
            "input_type": "clustering",
            "output_dimension": 4096,
        },
        headers={"Authorization": f"Bearer {tenant_key}"},
        timeout=10,
    )
    assert cohere.status_code == 400
    assert cohere.json()["error"]["param"] == "output_dimension"
    # Refused at the door: no job to run and then answer with a 400.
    assert not Job.objects.filter(service=services["embedding"]).exists()


def test_too_many_inputs_is_400_and_a_huge_body_is_413(client, front_door_url, tenant_key):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedding", input=["x"] * 257)
    assert assert_openai_shape(caught.value, 400, "invalid_value")["param"] == "input"
    response = requests.post(
        f"{front_door_url}/v1/embeddings",
        json={"model": "embedding", "input": ["word " * 4000] * 300},
        headers={"Authorization": f"Bearer {tenant_key}"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_malformed_json_and_bad_headers_are_400(front_door_url, tenant_key, services):
    auth = {"Authorization": f"Bearer {tenant_key}", "Content-Type": "application/json"}
    response = requests.post(f"{front_door_url}/v1/embeddings", data="{", headers=auth, timeout=5)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"
    for header in ({"X-Renq-Priority": "urgent"}, {"X-Renq-Deadline-Ms": "soon"}):
        response = requests.post(
            f"{front_door_url}/v1/embeddings",
            json={"model": "embedding", "input": "hi"},
            headers={**auth, **header},
            timeout=5,
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == next(iter(header))


def test_rate_limit_is_429_with_retry_after(client, unserved):
    Service.objects.filter(name=unserved).update(rate_limit=1)
    refused = []
    # No worker here: admitted requests time out (~0.25 s each), so three requests span at
    # most two seconds and two of them share one: at least one is over 1 job/s.
    for _ in range(3):
        try:
            client.embeddings.create(
                model=unserved, input="hi", extra_headers={"X-Renq-Deadline-Ms": "1"}
            )
        except openai.RateLimitError as exc:
            refused.append(exc)
        except openai.APIStatusError as exc:
            assert exc.status_code == 504
    assert refused
    assert_openai_shape(refused[0], 429, "rate_limit_exceeded")
    assert int(refused[0].response.headers["Retry-After"]) >= 1


def test_a_line_claimed_late_is_503_with_retry_after(client, unserved):
    Service.objects.filter(name=unserved).update(queue_timeout=2.0)
    tenant = Tenant.objects.get(name="oai-tenant")
    job = submit_job(tenant=tenant, service_name=unserved, payload={"texts": ["hi"]})
    behind = submit_job(tenant=tenant, service_name=unserved, payload={"texts": ["behind"]})
    Job.objects.filter(pk__in=[job.pk, behind.pk]).update(
        created_at=timezone.now() - timedelta(seconds=1.5)
    )
    claimed_at = time.monotonic()
    note_claim(Job.objects.claim([job.pk], worker="test-worker"), BatchReport())

    with pytest.raises(openai.APIStatusError) as caught:
        client.embeddings.create(model=unserved, input="hi")

    assert_openai_shape(caught.value, 503, "queue_full")
    headers = caught.value.response.headers
    # Not before the line's mark lapses (a quarter of a second after the late claim); the SDK
    # reads retry-after-ms first.
    retry_ms = int(headers["retry-after-ms"])
    assert retry_ms >= 250 - (time.monotonic() - claimed_at) * 1000 - 1
    assert headers["Retry-After"] == str(math.ceil(retry_ms / 1000))


def test_no_result_by_the_deadline_is_504_with_the_job_id(client, unserved):
    # No GPU worker consumes this service's queues: the job cannot finish.
    with pytest.raises(openai.APIStatusError) as caught:
        client.embeddings.create(
            model=unserved, input="hi", extra_headers={"X-Renq-Deadline-Ms": "300"}
        )
    assert_openai_shape(caught.value, 504, "job_timeout")
    job_id = caught.value.response.headers["X-Renq-Job-Id"]
    assert job_id in caught.value.message
    # The deadline was the client's: a job nobody started is cancelled, not left to run.
    assert Job.objects.get(pk=job_id).status == JobStatus.CANCELLED


def test_a_job_no_backend_can_serve_is_refused_before_it_is_stored(
    client, services, make_backend, make_route, monkeypatch
):
    monkeypatch.delenv("RENQ_TEST_UNSET_KEY", raising=False)  # unset in the web process too
    make_route(
        services["embedding"], (make_backend("keyless", api_key_env="RENQ_TEST_UNSET_KEY"), 0)
    )
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="embedding", input="hi")
    body = assert_openai_shape(caught.value, 400, "no_backend_available")
    assert body["message"] == (
        "no configured backend can serve this job: keyless: misconfigured: environment "
        "variable RENQ_TEST_UNSET_KEY is not set"
    )
    assert not Job.objects.exists()


def test_a_path_the_front_door_does_not_serve_is_404_in_openai_shape(client, front_door_url):
    # An SDK method renq does not implement (OpenAI's moderations, Cohere's v2 chat) gets an
    # error its SDK can read, not an HTML page.
    with pytest.raises(openai.NotFoundError) as caught:
        client.moderations.create(input="hi")
    body = assert_openai_shape(caught.value, 404, "unknown_url")
    assert "POST /v1/moderations" in body["message"]
    answer = requests.post(f"{front_door_url}/v2/chat", json={"model": "x"}, timeout=5)
    assert answer.status_code == 404
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json()["error"]["code"] == "unknown_url"
