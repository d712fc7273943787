"""The rerank shapes clients use, each through the client its users have: Cohere's SDK (v1
`/v1/rerank` and v2 `/v2/rerank`), LangChain's CohereRerank, and TEI's `/rerank`; every
request one renq job run by the real GPU worker behind a real gunicorn."""

from __future__ import annotations

import pytest
import requests

from inference.models import Job, JobStatus
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

QUERY = "what is a cat"
DOCUMENTS = ["a cat is an animal", "tax forms are due", "cats purr"]


def job_of(answer_id: str) -> Job:
    """The answer's job once stored (an api or realtime answer comes just before its store)."""
    return wait_for_job(answer_id.removeprefix("rerank-"))


def stored_ranking(job: Job) -> list[tuple[int, float]]:
    return [(i, job.result["scores"][i]) for i in job.result["ranking"]]


def test_cohere_v1_client(gpu_worker, services, tenant_key, front_door_url):
    import cohere

    client = cohere.Client(api_key=tenant_key, base_url=front_door_url, timeout=60)
    answer = client.rerank(
        model="reranker", query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True
    )
    job = job_of(answer.id)
    assert job.status == JobStatus.SUCCEEDED
    assert [(r.index, r.relevance_score) for r in answer.results] == stored_ranking(job)[:2]
    assert [r.document.text for r in answer.results] == [DOCUMENTS[r.index] for r in answer.results]
    assert answer.meta.api_version.version == "1"
    assert answer.meta.billed_units.search_units == 1
    assert answer.meta.tokens.input_tokens > 0


def test_cohere_v2_client(gpu_worker, services, tenant_key, front_door_url):
    import cohere

    client = cohere.ClientV2(api_key=tenant_key, base_url=front_door_url, timeout=60)
    answer = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS)
    job = job_of(answer.id)
    assert [(r.index, r.relevance_score) for r in answer.results] == stored_ranking(job)
    assert all("document" not in r.model_dump() for r in answer.results)  # as Cohere's v2
    assert answer.meta.api_version.version == "2"
    assert answer.meta.billed_units.search_units == 1
    with pytest.raises(cohere.BadRequestError) as caught:
        client.rerank(model="reranker", query=QUERY, documents=[])
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["param"] == "documents"


def test_langchain_cohere_rerank(gpu_worker, services, tenant_key, front_door_url):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(
        model="reranker", cohere_api_key=tenant_key, base_url=front_door_url, top_n=2
    )
    kept = reranker.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    assert len(kept) == 2
    scores = [document.metadata["relevance_score"] for document in kept]
    assert scores == sorted(scores, reverse=True)
    assert {document.page_content for document in kept} <= set(DOCUMENTS)


def test_tei_rerank_answers_a_list_and_needs_no_model(
    gpu_worker, services, tenant_key, front_door_url
):
    response = requests.post(
        f"{front_door_url}/rerank",
        json={"query": QUERY, "texts": DOCUMENTS, "return_text": True, "raw_scores": False},
        headers={"Authorization": f"Bearer {tenant_key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    job = job_of(response.headers["X-Renq-Job-Id"])
    assert job.service.name == "reranker"  # the only reranker service
    assert [(item["index"], item["score"]) for item in answer] == stored_ranking(job)
    assert [item["text"] for item in answer] == [DOCUMENTS[item["index"]] for item in answer]
    refused = requests.post(
        f"{front_door_url}/rerank",
        json={"query": QUERY, "texts": "not a list"},
        headers={"Authorization": f"Bearer {tenant_key}"},
        timeout=60,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "texts"
