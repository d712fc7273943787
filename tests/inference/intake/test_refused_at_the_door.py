"""A job no configured backend can serve is refused at submission (400 naming each backend's
limit or missing key, nothing stored), and long texts are estimated as the model reads them:
the REST API with the shipped configuration (fixtures/config.yaml) and no cloud API keys, as
the README's set-up leaves it, on the real Postgres, Redis and RabbitMQ."""

from __future__ import annotations

import pytest

from inference.config.file import load_config_file
from inference.models import Job
from routing.models import JobRoute
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

CLOUD_KEYS = ("RENQ_FREE_CLOUD_API_KEY", "RENQ_PAID_CLOUD_API_KEY")
# ~300 words, ~1,900 characters: ~480 estimated tokens, of which MiniLM reads 256.
LONG_TEXT = " ".join(f"word{i % 50}" for i in range(300))


@pytest.fixture
def shipped_config(monkeypatch):
    for name in CLOUD_KEYS:
        monkeypatch.delenv(name, raising=False)
    load_config_file(ROOT / "fixtures" / "config.yaml")


def submit(api, **body):
    return api.post("/api/v1/jobs", body, format="json")


def test_128_long_texts_go_to_the_local_worker_not_a_keyless_cloud(
    api, shipped_config, gpu_consumer
):
    gpu_consumer.attach("embedding")  # one embedding worker, as in the README's set-up
    response = submit(api, service="embedding", input={"texts": [LONG_TEXT] * 128})
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["backend"] == "local-embedding", body["route_reason"]
    route = JobRoute.objects.get(job_id=body["id"])
    assert route.backend.name == "local-embedding"
    assert "cloud" not in route.reason


def test_every_capable_backend_keyless_is_400_naming_the_variable(api, shipped_config):
    # ~10,000 tokens: more than local-llm's and free-cloud's context (8192), and paid-cloud,
    # which would hold it, has no key here.
    response = submit(api, service="llm", input={"prompt": "word " * 8000})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "no_backend_available"
    assert error["fields"] == {"input": [error["message"].removeprefix("input: ")]}
    assert (
        "local-llm: this job's longest input (~10064 tokens) exceeds its max_context_tokens"
        in (error["message"])
    )
    assert (
        "paid-cloud: misconfigured: environment variable RENQ_PAID_CLOUD_API_KEY is not set"
        in (error["message"])
    )
    assert not Job.objects.exists()


def test_the_same_job_is_accepted_once_the_key_is_set(api, shipped_config, monkeypatch):
    monkeypatch.setenv("RENQ_PAID_CLOUD_API_KEY", "sk-set")
    response = submit(api, service="llm", input={"prompt": "word " * 8000})
    assert response.status_code == 202, response.content
    assert response.json()["backend"] == "paid-cloud"


def test_too_large_for_every_backend_is_400_context_length_exceeded(
    api, make_service, make_backend, make_route
):
    service = make_service("llm", name="small-llm")
    make_route(
        service,
        (make_backend("local-small", kind="local", max_context_tokens=1000), 0),
        (make_backend("cloud-small", max_context_tokens=2000), 1),
    )
    response = submit(api, service="small-llm", input={"prompt": "word " * 2000})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"] == (
        "input: no configured backend can serve this job: "
        "local-small: this job's longest input (~2564 tokens) exceeds its max_context_tokens "
        "1000; cloud-small: this job's longest input (~2564 tokens) exceeds its "
        "max_context_tokens 2000"
    )
    assert not Job.objects.exists()
    # In a list, as any invalid item: that item is refused, the others accepted.
    response = api.post(
        "/api/v1/jobs",
        [
            {"service": "small-llm", "input": {"prompt": "short"}},
            {"service": "small-llm", "input": {"prompt": "word " * 2000}},
        ],
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (1, 1)
    refused = body["jobs"][1]["error"]
    assert refused["code"] == "context_length_exceeded" and refused["field"] == "[1].input"
    assert Job.objects.count() == 1
