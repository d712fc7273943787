"""The Batch API (inference.batch_api) through the official client: files.create →
batches.create → polling batches.retrieve → files.content, run as offline renq jobs by real
workers."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from inference.models import Job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

FINAL = {"completed", "failed", "expired", "cancelled"}


def jsonl(lines: list[dict]) -> io.BytesIO:
    return io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def wait_for_batch(client, batch_id: str, timeout_s: float = 60, statuses=FINAL):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def read_lines(client, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def submit(client, lines: list[dict], endpoint: str):
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,
        completion_window="24h",
        metadata={"job": "test"},
    )


def test_embeddings_batch_completes_with_one_answer_per_line(gpu_worker, control_worker, client):
    texts = [f"sentence number {i}" for i in range(50)]
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "embedding", "input": text, "encoding_format": "float"},
        }
        for i, text in enumerate(texts)
    ]
    lines[7]["body"]["input"] = ""  # refused at submission: an error line, not a failed batch
    batch = submit(client, lines, "/v1/embeddings")
    assert batch.status == "validating" and batch.metadata == {"job": "test"}

    done = wait_for_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 50
    assert done.request_counts.completed == 49 and done.request_counts.failed == 1
    assert done.in_progress_at and done.finalizing_at and done.completed_at

    outputs = {line["custom_id"]: line for line in read_lines(client, done.output_file_id)}
    assert len(outputs) == 49
    answer = outputs["req-3"]["response"]
    assert answer["status_code"] == 200 and outputs["req-3"]["error"] is None
    assert answer["body"]["object"] == "list" and len(answer["body"]["data"][0]["embedding"]) == 384
    assert outputs["req-3"]["id"].startswith("batch_req_")
    job = Job.objects.get(pk=answer["request_id"])
    assert job.tier == "offline" and job.input["texts"] == [texts[3]]
    assert answer["body"]["data"][0]["embedding"] == job.embedding_matrix().tolist()[0]

    (refused,) = read_lines(client, done.error_file_id)
    assert refused["custom_id"] == "req-7" and refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "input[0]"


def test_chat_batch(gpu_worker, control_worker, client):
    lines = [
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "llm",
                "messages": [{"role": "user", "content": f"count to {i}"}],
                "max_tokens": 3,
            },
        }
        for i in range(4)
    ]
    done = wait_for_batch(client, submit(client, lines, "/v1/chat/completions").id)
    assert done.status == "completed" and done.request_counts.completed == 4
    outputs = read_lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in outputs) == [f"chat-{i}" for i in range(4)]
    assert all(line["response"]["body"]["object"] == "chat.completion" for line in outputs)
    assert done.error_file_id is None


def test_malformed_file_fails_the_batch_naming_the_lines(control_worker, client):
    good = {"method": "POST", "url": "/v1/embeddings", "body": {"model": "embedding", "input": "x"}}
    content = (
        json.dumps({"custom_id": "a", **good})
        + "\n{not json\n"
        + json.dumps({"custom_id": "a", **good})
        + "\n"
        + json.dumps({"custom_id": "c", **good, "url": "/v1/completions"})
        + "\n"
    ).encode()
    uploaded = client.files.create(file=("bad.jsonl", io.BytesIO(content)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait_for_batch(client, batch.id)
    assert done.status == "failed" and done.failed_at
    errors = {(error.line, error.code) for error in done.errors.data}
    assert errors == {
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "mismatched_endpoint"),
    }


def test_cancel_keeps_what_finished(control_worker, client, unserved):
    # No worker serves the model: the lines stay queued, so cancelling catches all of them.
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": unserved, "input": f"text {i}"},
        }
        for i in range(5)
    ]
    batch = submit(client, lines, "/v1/embeddings")
    wait_for_batch(client, batch.id, statuses={"in_progress"})
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_for_batch(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts.completed == 0
    assert set(
        Job.objects.filter(batch_request__batch__isnull=False).values_list("status", flat=True)
    ) <= {"cancelled"}
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_other_tenants_see_404_and_list_pages(control_worker, client, make_tenant, front_door_url):
    from openai import OpenAI

    line = {
        "custom_id": "x",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "embedding", "input": "x"},
    }
    first = submit(client, [line], "/v1/embeddings")
    second = submit(client, [line], "/v1/embeddings")
    page = client.batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more
    assert [b.id for b in client.batches.list(limit=5, after=second.id).data] == [first.id]

    _, other_key = make_tenant("someone-else")
    other = OpenAI(base_url=f"{front_door_url}/v1", api_key=other_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(first.input_file_id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(first.input_file_id)
    assert client.files.retrieve(first.input_file_id).purpose == "batch"
