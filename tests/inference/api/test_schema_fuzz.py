"""Schemathesis against the published OpenAPI schema (`/api/schema/`), authenticated as a
tenant, through a real gunicorn serving the app as production does (ASGI): no 5xx, and every
status code, header and body the API answers is one the schema documents (and whatever the
schema admits, the API accepts).

The schemathesis CLI runs all its phases (examples, coverage, fuzzing, stateful links) with
RENQ_FUZZ_MAX_EXAMPLES cases per operation: 10 by default, well under a minute, for CI;
`make fuzz` runs the same with many more and prints the report. Inputs schemathesis does not
think of (NUL, lone surrogates, bodies over the limit) are tested by name in
tests/inference/api/test_admission_and_limits.py and below.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.renq_site.helpers import (
    RUN_DIR,
    VENV_BIN,
    ChildProcess,
    child_database_url,
    free_port,
)

pytestmark = pytest.mark.fuzz

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
    port = free_port()
    web = ChildProcess(
        "test-fuzz-gunicorn",
        [
            str(VENV_BIN / "gunicorn"),
            "renq_site.asgi:application",
            "-k",
            "uvicorn_worker.UvicornWorker",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "1",
        ],
        env={"DATABASE_URL": child_database_url()},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        web.wait_until(lambda: requests.get(f"{url}/healthz", timeout=1).ok, "gunicorn", 60)
        yield url, key
    finally:
        web.stop()


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


def test_api_conforms_to_its_schema(fuzz_server):
    url, key = fuzz_server
    code, output = run_schemathesis(url, key, MAX_EXAMPLES, SEED)
    cases = generated_cases(output)
    print(f"schemathesis: {cases} generated cases")
    assert cases > 0, output[-3000:]
    assert code == 0, f"schemathesis found failures (see .run/schemathesis.log):\n{output[-8000:]}"
