"""Schemathesis against the published OpenAPI schema (`/api/schema/`), authenticated as a
tenant, through a real gunicorn serving the app as production does (ASGI): no 5xx, and every
status code, header and body the API answers is one the schema documents (and whatever the
schema admits, the API accepts).

The schemathesis CLI runs all its phases (examples, coverage, fuzzing, stateful links) with
RENQ_FUZZ_MAX_EXAMPLES cases per operation: 10 by default, well under a minute, for CI;
`make fuzz` runs the same with many more and prints the report. Inputs schemathesis does not
think of (NUL, lone surrogates, bodies over the limit) are tested by name in
tests/inference/api/test_admission_and_limits.py; what it found is tested by name below.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.renq_site.helpers import RUN_DIR, VENV_BIN, asgi_web_server

CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = int(os.environ.get("RENQ_FUZZ_MAX_EXAMPLES", "10"))
SEED = int(os.environ.get("RENQ_FUZZ_SEED", "20240612"))
# Every check that judges one response (the others need a second identity or a resource
# created elsewhere): server errors, documented status codes, content types, headers and
# bodies, and both directions of input validation.
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "positive_data_acceptance",
    ]
)


@pytest.fixture
def fuzz_server(transactional_db, make_tenant, make_service) -> Iterator[tuple[str, str]]:
    """gunicorn (ASGI, as `make web` runs it) on the test database, with a tenant and every
    service kind committed; yields (url, api key)."""
    for kind in ("embedding", "reranker", "llm", "noop"):
        make_service(kind, max_queue_size=1_000_000)
    _, key = make_tenant("fuzz", plan="enterprise")
    with asgi_web_server("test-fuzz-gunicorn") as url:
        yield url, key


def run_schemathesis(url: str, key: str, max_examples: int, seed: int) -> tuple[int, str]:
    argv = [
        str(VENV_BIN / "st"),
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/api/schema/",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        CHECKS,
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--exclude-path",
        "/api/schema/",
        "--continue-on-failure",
        "--no-color",
        "--output-sanitize",
        "true",
    ]
    started = time.monotonic()
    RUN_DIR.mkdir(exist_ok=True)
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=RUN_DIR,  # its .schemathesis/ cache stays out of the work tree
        env={**os.environ, "NO_COLOR": "1"},
    )
    output = done.stdout + done.stderr
    (RUN_DIR / "schemathesis.log").write_text(output)
    print(output[-6000:])
    print(f"schemathesis ran {time.monotonic() - started:.1f} s")
    return done.returncode, output


def generated_cases(output: str) -> int:
    """The case count from schemathesis's summary ("Test cases:\\n  849 generated, …")."""
    match = re.search(r"(\d+) generated", output)
    return int(match.group(1)) if match else 0


@pytest.mark.fuzz
def test_api_conforms_to_its_schema(fuzz_server):
    url, key = fuzz_server
    code, output = run_schemathesis(url, key, MAX_EXAMPLES, SEED)
    cases = generated_cases(output)
    print(f"schemathesis: {cases} generated cases")
    assert cases > 0, output[-3000:]
    assert code == 0, f"schemathesis found failures (see .run/schemathesis.log):\n{output[-8000:]}"


# --- what the fuzzer found, by name (fast, in-process) -------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["emb\u0000edding", "emb\ud800edding"])
@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/bulk"])
def test_a_service_name_the_database_cannot_take_is_a_400_not_a_500(api, path, name):
    body = json.dumps({"service": name, "input": {"texts": ["a"]}})
    response = api.post(path, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "service" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_list_filters_are_strict(api):
    assert api.get("/api/v1/jobs", {"service": "a\u0000b"}).status_code == 400
    assert api.get("/api/v1/jobs", {"status": ""}).status_code == 400  # not "any status"
    assert api.get("/api/v1/jobs", {"limit": "0"}).status_code == 400
    assert api.get("/api/v1/jobs", {"offset": "null"}).status_code == 400


@pytest.mark.django_db
def test_a_malformed_job_id_is_a_json_404(api):
    response = api.get("/api/v1/jobs/null,null")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.django_db
def test_bulk_priority_must_be_a_bulk_tier_not_any_falsy_value(api, make_service):
    make_service("noop")
    body = {"service": "noop", "input": {"texts": ["a"]}}
    for priority in ({}, [], 0, False, "realtime"):
        response = api.post("/api/v1/jobs/bulk", {**body, "priority": priority}, format="json")
        assert response.status_code == 400, (priority, response.content)
    ok = api.post("/api/v1/jobs/bulk", {**body, "priority": None}, format="json")
    assert ok.status_code == 202 and ok.json()["priority"] == "batch"
    assert ok.json()["queue_wait_ms"] >= 0  # created and started at the same instant


@pytest.mark.django_db
def test_a_form_body_is_a_415(api, make_service):
    make_service("noop")
    response = api.post("/api/v1/jobs", {"service": "noop", "input": "{}"}, format="multipart")
    assert response.status_code == 415
    assert "error" in response.json()


def test_the_schema_declares_what_the_api_enforces():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    submit = schema["components"]["schemas"]["JobSubmit"]
    assert submit["additionalProperties"] is False
    assert submit["properties"]["service"]["minLength"] == 1
    assert submit["properties"]["input"]["type"] == "object"
    assert schema["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"
    jobs = schema["paths"]["/api/v1/jobs"]
    assert list(jobs["post"]["requestBody"]["content"]) == ["application/json"]
    limit = next(p for p in jobs["get"]["parameters"] if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path.startswith("/api/v1/"):
                assert {"401", "503"} <= set(operation["responses"]), (method, path)
