"""The REST API as a client sees it: auth, validation errors naming the field, isolation."""

from __future__ import annotations

import base64
import struct

import pytest
from rest_framework.test import APIClient

from inference.api.serializers import JobAcceptedSerializer
from inference.intake.submission import input_digest
from inference.jobs.vectors import split_result
from inference.metrics.events import ADMISSION_REFUSED
from inference.models import AuditEvent, Job, JobStatus

pytestmark = pytest.mark.django_db


def submit(api, **body):
    return api.post("/api/v1/jobs", body, format="json")


@pytest.fixture
def embedding(make_service):
    return make_service("embedding")


def test_submit_returns_202_with_the_queued_job(api, embedding):
    response = submit(api, service="embedding", input={"texts": ["hello"]}, priority="realtime")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "queued"
    assert body["priority"] == "realtime"
    assert body["service"] == "embedding"
    job = Job.objects.get(pk=body["id"])
    assert job.tenant == api.tenant
    assert job.message_priority == 2  # pro plan boost


def test_a_submitted_job_and_its_receipt_are_stored_as_sent(api, embedding):
    # The submit path writes its rows with its own INSERT (inference.intake.row_writer).
    texts = ["naïve café ✓", 'quote " and \\ backslash', "x" * 300]
    response = api.post(
        "/api/v1/jobs",
        {
            "service": "embedding",
            "priority": "batch",
            "deadline_ms": 60_000,
            "input": {"texts": texts},
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="key-1",
    )
    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.input, job.tier, job.status, job.service, job.tenant) == (
        {"texts": texts}, "batch", "queued", embedding, api.tenant,
    )  # fmt: skip
    assert job.idempotency_key == "key-1" and job.published_at == job.created_at
    assert (job.deadline_at - job.created_at).total_seconds() == 60
    (receipt,) = AuditEvent.objects.filter(kind="received")
    assert (receipt.job_id, receipt.tenant_id, receipt.at) == (
        job.pk,
        api.tenant.pk,
        job.created_at,
    )
    assert receipt.detail == {"service": "embedding", "tier": "batch"}
    assert receipt.actor.startswith("api:")


def test_priority_defaults_to_the_tenants_tier(make_tenant, embedding):
    tenant, key = make_tenant(name="nightly", plan="free", tier="offline")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    body = submit(client, service="embedding", input={"texts": ["x"]}).json()
    assert body["priority"] == "offline"
    assert Job.objects.get(pk=body["id"]).message_priority == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"service": "nope", "input": {"texts": ["a"]}}, "service"),
        ({"input": {"texts": ["a"]}}, "service"),
        ({"service": "embedding"}, "input"),
        ({"service": "embedding", "input": {}}, "input.texts"),
        ({"service": "embedding", "input": {"texts": []}}, "input.texts"),
        ({"service": "embedding", "input": {"texts": "abc"}}, "input.texts"),
        ({"service": "embedding", "input": {"texts": ["ok", ""]}}, "input.texts[1]"),
        ({"service": "embedding", "input": {"texts": ["a" * 20_001]}}, "input.texts[0]"),
        ({"service": "embedding", "input": {"texts": ["a"] * 257}}, "input.texts"),
        ({"service": "embedding", "input": {"texts": ["a"], "extra": 1}}, "input.extra"),
        ({"service": "embedding", "input": {"texts": ["a"]}, "priority": "urgent"}, "priority"),
        ({"service": "embedding", "input": ["a"]}, "input"),
    ],
)
def test_bad_input_is_400_naming_the_field(api, embedding, body, field):
    response = submit(api, **body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert Job.objects.count() == 0


def test_malformed_json_is_400(api, embedding):
    response = api.post(
        "/api/v1/jobs", data='{"service": "embedding",', content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"
    assert "body" in response.json()["error"]["fields"]


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"query": "", "documents": ["a"]}, "input.query"),
        ({"query": "q", "documents": []}, "input.documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "input.top_n"),
    ],
)
def test_reranker_input_errors_name_the_field(api, make_service, payload, field):
    make_service("reranker")
    response = submit(api, service="reranker", input=payload)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"max_tokens": 5}, "input.prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "input.max_tokens"),
        ({"prompt": "hi", "temperature": 3}, "input.temperature"),
        ({"prompt": "hi", "temperature": "hot"}, "input.temperature"),
    ],
)
def test_llm_input_errors_name_the_field(api, make_service, payload, field):
    make_service("llm")
    response = submit(api, service="llm", input=payload)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_no_key_and_wrong_key_are_401(embedding):
    client = APIClient()
    assert client.get("/api/v1/jobs").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Bearer rq_not_a_key")
    response = client.post(
        "/api/v1/jobs", {"service": "embedding", "input": {"texts": ["a"]}}, format="json"
    )
    assert response.status_code == 401
    assert Job.objects.count() == 0


def test_revoked_key_and_inactive_tenant_are_401(make_tenant, embedding):
    from inference.models import ApiKey

    tenant, key = make_tenant()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/jobs").status_code == 200
    ApiKey.objects.filter(tenant=tenant).update(revoked=True)
    assert client.get("/api/v1/jobs").status_code == 401


def test_another_tenants_job_is_404(api, make_tenant, embedding):
    job_id = submit(api, service="embedding", input={"texts": ["mine"]}).json()["id"]
    _, other_key = make_tenant(name="other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_key}")
    assert other.get(f"/api/v1/jobs/{job_id}").status_code == 404
    assert other.delete(f"/api/v1/jobs/{job_id}").status_code == 404
    assert other.get("/api/v1/jobs").json()["count"] == 0
    assert api.get(f"/api/v1/jobs/{job_id}").status_code == 200


def test_list_filters_by_status_and_service(api, make_service, embedding):
    make_service("llm")
    a = submit(api, service="embedding", input={"texts": ["a"]}).json()["id"]
    submit(api, service="llm", input={"prompt": "hi"})
    api.delete(f"/api/v1/jobs/{a}")
    assert api.get("/api/v1/jobs").json()["count"] == 2
    assert api.get("/api/v1/jobs?service=llm").json()["count"] == 1
    cancelled = api.get("/api/v1/jobs?status=cancelled").json()
    assert [j["id"] for j in cancelled["results"]] == [a]
    assert api.get("/api/v1/jobs?status=bogus").status_code == 400


def test_cancel_queued_job_then_cancel_again_is_409(api, embedding):
    job_id = submit(api, service="embedding", input={"texts": ["a"]}).json()["id"]
    response = api.delete(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert api.delete(f"/api/v1/jobs/{job_id}").status_code == 409


def test_services_list_shows_runtime_settings(api, embedding):
    services = api.get("/api/v1/services").json()["results"]
    assert services[0]["name"] == "embedding"
    runtime = services[0]["runtime"]
    for key in (
        "batch_size",
        "batch_timeout",
        "max_queue_size",
        "worker_count",
        "queue_timeout",
        "inference_timeout",
        "total_timeout",
        "rate_limit",
        "enable_cache",
    ):
        assert key in runtime


def test_full_queue_is_503_with_retry_after(api, make_service):
    make_service("embedding", max_queue_size=2)
    for _ in range(2):
        assert submit(api, service="embedding", input={"texts": ["a"]}).status_code == 202
    response = submit(api, service="embedding", input={"texts": ["a"]})
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert Job.objects.count() == 2


def test_a_refusal_is_counted_and_not_logged_as_an_error(api, make_service, caplog):
    make_service("embedding", max_queue_size=1)
    counted = ADMISSION_REFUSED.labels("503", "max_queue_size")
    before = counted._value.get()

    codes = [submit(api, service="embedding", input={"texts": ["a"]}).status_code for _ in range(3)]

    assert codes == [202, 503, 503]
    assert counted._value.get() == before + 2
    # A flood of retries would otherwise write an ERROR line per refusal.
    assert not [r for r in caplog.records if r.name == "django.request"]


def test_rate_limit_is_429_with_retry_after(api, make_service, admission_clock_fixed):
    make_service("embedding", rate_limit=3)
    codes = [submit(api, service="embedding", input={"texts": ["a"]}).status_code for _ in range(5)]
    assert codes.count(202) <= 3 and 429 in codes, codes


def _stored_embedding(tenant, service, text: str, vectors: list[list[float]]) -> Job:
    """A finished embedding job as the worker stores it: vectors as float32 bytes."""
    result, packed = split_result({"embeddings": vectors, "dim": len(vectors[0])})
    return Job.objects.create(
        tenant=tenant,
        service=service,
        tier="api",
        input={"texts": [text]},
        input_hash=input_digest(service, tenant, {"texts": [text]}),
        status=JobStatus.SUCCEEDED,
        result=result,
        result_vectors=packed,
    )


def test_cache_answers_identical_input_without_a_worker(api, make_service):
    service = make_service("embedding", enable_cache=True)
    _stored_embedding(api.tenant, service, "same", [[0.5, -0.25, 3.0]])
    body = submit(api, service="embedding", input={"texts": ["same"]}).json()
    assert body["status"] == "succeeded" and body["cached"] is True
    assert body["result"] == {"embeddings": [[0.5, -0.25, 3.0]], "dim": 3}
    # The hit is a job of its own holding a copy of the bytes, readable in either encoding.
    hit = Job.objects.get(pk=body["id"])
    assert bytes(hit.result_vectors) == struct.pack("<3f", 0.5, -0.25, 3.0)
    packed = api.get(f"/api/v1/jobs/{hit.pk}?encoding_format=base64").json()["result"]
    stored = base64.b64encode(struct.pack("<3f", 0.5, -0.25, 3.0)).decode()
    assert packed == {"embeddings": [stored], "dim": 3}
    answer = api.post(
        "/api/v1/jobs?encoding_format=base64",
        {"service": "embedding", "input": {"texts": ["same"]}},
        format="json",
    ).json()
    assert answer["cached"] is True and answer["result"] == packed


def test_the_202_body_is_the_documented_accepted_job(api, make_service, make_backend, make_route):
    # The views write the answer without the serializer (its cost is paid on every POST); it
    # must stay field for field what the schema documents, for every shape of answer.
    service = make_service("embedding", enable_cache=True)
    _stored_embedding(api.tenant, service, "seen", [[0.5, -0.25]])
    routed = make_service("embedding", name="routed-embedding")
    make_route(routed, (make_backend("local-embedding", kind="local"), 0))
    answers = [
        (submit(api, service="embedding", input={"texts": ["new"]}, priority="realtime"), "float"),
        (submit(api, service="embedding", input={"texts": ["seen"]}), "float"),
        (
            api.post(
                "/api/v1/jobs?encoding_format=base64",
                {"service": "embedding", "input": {"texts": ["seen"]}},
                format="json",
            ),
            "base64",
        ),
        (submit(api, service="routed-embedding", input={"texts": ["x"]}), "float"),
    ]
    for response, encoding_format in answers:
        body = response.json()
        job = Job.objects.select_related("service", "route__backend").get(pk=body["id"])
        context = {"encoding_format": encoding_format}
        assert body == JobAcceptedSerializer(job, context=context).data
    assert [body["cached"] for body in (r.json() for r, _ in answers)] == [
        False, True, True, False,
    ]  # fmt: skip
    assert answers[3][0].json()["backend"] == "local-embedding"
    assert answers[3][0].json()["route_reason"]


def test_a_row_stored_before_result_vectors_still_reads(api, make_service):
    # Jobs finished before the vectors had their own column keep JSON float lists.
    job = Job.objects.create(
        tenant=api.tenant,
        service=make_service("embedding"),
        tier="api",
        input={"texts": ["old"]},
        status=JobStatus.SUCCEEDED,
        result={"embeddings": [[1.0, 0.5]], "dim": 2},
    )
    assert api.get(f"/api/v1/jobs/{job.pk}").json()["result"] == job.result
    packed = api.get(f"/api/v1/jobs/{job.pk}?encoding_format=base64").json()["result"]
    assert base64.b64decode(packed["embeddings"][0]) == struct.pack("<2f", 1.0, 0.5)


@pytest.mark.parametrize("value", ["binary", "FLOAT", ""])
def test_unknown_encoding_format_is_400_naming_it(api, make_service, value):
    service = make_service("embedding")
    job = _stored_embedding(api.tenant, service, "x", [[1.0]])
    response = api.get(f"/api/v1/jobs/{job.pk}", {"encoding_format": value})
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["encoding_format"]
    response = api.post(
        f"/api/v1/jobs?encoding_format={value}",
        {"service": "embedding", "input": {"texts": ["y"]}},
        format="json",
    )
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["encoding_format"]
    assert Job.objects.count() == 1  # refused before any job was made


def test_the_cache_never_answers_another_tenants_input(api, make_tenant, make_service):
    service = make_service("embedding", enable_cache=True)
    Job.objects.create(
        tenant=api.tenant,
        service=service,
        tier="api",
        input={"texts": ["secret"]},
        input_hash=input_digest(service, api.tenant, {"texts": ["secret"]}),
        status=JobStatus.SUCCEEDED,
        result={"dim": 1, "count": 1},
        result_vectors=struct.pack("<f", 1.0),
    )
    _, other_key = make_tenant("other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_key}")
    body = submit(other, service="embedding", input={"texts": ["secret"]}).json()
    assert body["status"] == "queued" and body["cached"] is False


def test_openapi_schema_and_docs_are_served(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/jobs" in schema.content
    assert client.get("/api/docs/").status_code == 200


def test_create_tenant_command_prints_key_last(db):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("create_tenant", "cli-co", "--plan", "enterprise", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/jobs").status_code == 200
