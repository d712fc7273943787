"""renq_client and `manage.py renq` against a live server and a real worker: a bulk
submission larger than the service's rate limit waits out the 429s and loses nothing."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command

from renq_client import RenqClient, RenqError
from tests.conftest import WorkerProcess, purge_test_queues

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]
SERVICE = "clientembed"
TEXTS = 640  # 80 jobs: four times the rate limit's second
TEXTS_PER_JOB = 8
RATE_LIMIT = 20  # jobs/s per tenant: a 100-job request is refused with 429 until it shrinks


@pytest.fixture
def worker(make_service):
    service = make_service(
        "embedding", name=SERVICE, batch_size=32, batch_timeout=0.05, rate_limit=RATE_LIMIT
    )
    purge_test_queues()
    process = WorkerProcess(services=(SERVICE,), name="client")
    yield service
    process.stop()


def test_a_bulk_beyond_the_rate_limit_waits_out_the_429s(worker, live_server, make_tenant):
    _, key = make_tenant("bulky")
    client = RenqClient(live_server.url, key, max_wait_s=120)
    texts = [f"text number {i}" for i in range(TEXTS)]
    inputs = [{"texts": texts[i : i + TEXTS_PER_JOB]} for i in range(0, TEXTS, TEXTS_PER_JOB)]
    ids = client.bulk(SERVICE, inputs, priority="batch", chunk=100)
    assert len(ids) == len(set(ids)) == TEXTS // TEXTS_PER_JOB
    assert client.stats.retries >= 1 and client.stats.waited_s >= 1  # the 429s were honoured
    assert not client.stats.rejected
    jobs = list(client.results(ids, timeout_s=300))
    assert {job["status"] for job in jobs} == {"succeeded"}
    assert sum(len(job["result"]["embeddings"]) for job in jobs) == TEXTS


def test_submit_wait_and_errors(worker, live_server, make_tenant):
    _, key = make_tenant("single")
    client = RenqClient(live_server.url, key)
    job = client.wait(client.submit(SERVICE, {"texts": ["hello"]}, priority="realtime")["id"])
    assert job["status"] == "succeeded" and len(job["result"]["embeddings"]) == 1
    with pytest.raises(RenqError) as caught:
        client.submit(SERVICE, {"texts": []})
    assert caught.value.status == 400 and "texts" in caught.value.message
    with pytest.raises(RenqError) as caught:
        RenqClient(live_server.url, "rq_wrong").get(job["id"])
    assert caught.value.status == 401


def test_cli_submit_status_and_queues(worker, live_server, make_tenant, tmp_path):
    _, key = make_tenant("cli")
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"line {i}\n" for i in range(30)))
    ids_file = tmp_path / "ids"
    out = StringIO()
    call_command(
        "renq", "submit", "--service", SERVICE, "--file", str(texts), "--priority", "batch",
        "--texts-per-job", "3", "--url", live_server.url, "--key", key, "--wait",
        "--no-progress", "--ids-out", str(ids_file), stdout=out,
    )  # fmt: skip
    assert "submitted 10 jobs (30 lines)" in out.getvalue()
    assert "succeeded      10" in out.getvalue()
    out = StringIO()
    call_command(
        "renq", "status", "--ids", str(ids_file), "--url", live_server.url, "--key", key,
        stdout=out,
    )  # fmt: skip
    assert "succeeded      10" in out.getvalue() and "queue wait ms p50" in out.getvalue()
    out = StringIO()
    call_command("renq", "queues", stdout=out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith(SERVICE))
    # idle; one worker consuming its four tier queues
    assert row.split()[1:] == ["0", "0", "0", "0", "0", "4"]


def test_wait_reads_once_while_the_job_waits_on_the_server(live_server, make_service, make_tenant):
    unserved = make_service("embedding", name="client-unserved").name
    _, key = make_tenant("patient")
    client = RenqClient(live_server.url, key)
    job_id = client.submit(unserved, {"texts": ["nobody runs this"]})["id"]
    # Cancelled by another client a second in; a client polling every 0.1 s would read ~10 times.
    threading.Timer(1.0, RenqClient(live_server.url, key).cancel, (job_id,)).start()
    before = client.stats.requests
    assert client.wait(job_id, timeout_s=20)["status"] == "cancelled"
    assert client.stats.requests - before <= 2


def test_a_refusal_is_waited_out_to_the_millisecond(live_server, make_service, make_tenant):
    # One job a second: each refused submit may pass at the next second of the server's
    # clock, which its retry-after-ms says; Retry-After alone would keep the client a whole one.
    limited = make_service("embedding", name="client-limited", rate_limit=1).name
    _, key = make_tenant("prompt")
    client = RenqClient(live_server.url, key)
    for n in range(3):  # two of three submits share a second
        client.submit(limited, {"texts": [f"text {n}"]}, priority="batch")
    assert client.stats.retries >= 1
    assert client.stats.waited_s / client.stats.retries < 1.0
