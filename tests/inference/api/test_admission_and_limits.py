"""What a client gets at the edges: limits named in 4xx answers, quotas as 429 with
Retry-After, the realtime reserve, idempotent retries, many jobs per request, and 503 (never a
500) while a dependency is down."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from inference.intake.admission import AdmissionRefused
from inference.intake.submission import submit_job
from inference.models import AuditEvent, Job

pytestmark = pytest.mark.django_db


def submit(api, body, **headers):
    return api.post("/api/v1/jobs", body, format="json", **headers)


@pytest.fixture
def embedding(make_service):
    return make_service("embedding")


@pytest.mark.parametrize(("text", "why"), [("a\u0000b", "NUL"), ("x\ud800y", "lone surrogate")])
def test_text_the_database_cannot_store_is_a_400_naming_the_item(api, embedding, text, why):
    raw = json.dumps({"service": "embedding", "input": {"texts": ["fine", text]}})
    response = api.post("/api/v1/jobs", raw, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "input.texts[1]" in error["fields"] and why in error["message"]
    assert Job.objects.count() == 0


def test_a_typo_in_a_top_level_field_is_refused_by_name(api, embedding):
    response = submit(
        api, {"service": "embedding", "priorty": "realtime", "input": {"texts": ["a"]}}
    )
    assert response.status_code == 400
    assert "priorty" in response.json()["error"]["fields"]
    assert Job.objects.count() == 0


def test_a_body_over_the_limit_is_413_not_a_closed_connection(api, embedding, settings):
    settings.RENQ_MAX_REQUEST_BYTES = 10_000
    body = {"service": "embedding", "input": {"texts": ["x" * 20_000]}}
    response = submit(api, body)
    assert response.status_code == 413
    assert "RENQ_MAX_REQUEST_BYTES" in response.json()["error"]["message"]


def test_page_size_is_bounded_and_malformed_paging_is_named(api, embedding):
    assert api.get("/api/v1/jobs?limit=100000").status_code == 400
    response = api.get("/api/v1/jobs?offset=null")
    assert response.status_code == 400 and "offset" in response.json()["error"]["fields"]
    assert api.get("/api/v1/jobs?limit=500").status_code == 200


def test_the_same_idempotency_key_returns_the_same_job(api, embedding):
    body = {"service": "embedding", "input": {"texts": ["once"]}}
    first = submit(api, body, HTTP_IDEMPOTENCY_KEY="retry-42")
    again = submit(api, body, HTTP_IDEMPOTENCY_KEY="retry-42")
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.count() == 1
    assert submit(api, body, HTTP_IDEMPOTENCY_KEY="another").json()["id"] != first.json()["id"]


def test_many_jobs_in_one_request_with_per_item_errors(api, embedding):
    items = [
        {"service": "embedding", "input": {"texts": [f"t{i}"]}, "priority": "batch"}
        for i in range(5)
    ]
    items.insert(2, {"service": "embedding", "input": {"texts": []}})
    response = submit(api, items)
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (5, 1)
    assert "[2].input.texts" in body["jobs"][2]["error"]["field"]
    assert all(j["status"] == "queued" for k, j in enumerate(body["jobs"]) if k != 2)
    assert Job.objects.count() == 5
    assert AuditEvent.objects.filter(kind="received").count() == 5


def test_tenant_quotas_answer_429_naming_the_quota(api, embedding, admission_clock_fixed):
    api.tenant.requests_per_minute = 2
    api.tenant.save()
    codes = [submit(api, {"service": "embedding", "input": {"texts": ["a"]}}) for _ in range(3)]
    assert [r.status_code for r in codes] == [202, 202, 429]
    refused = codes[-1]
    assert refused.json()["error"]["quota"] == "requests_per_minute"
    assert 1 <= int(refused["Retry-After"]) <= 60


def test_max_running_jobs_quota(api, embedding):
    api.tenant.max_running_jobs = 2
    api.tenant.save()
    codes = [
        submit(api, {"service": "embedding", "input": {"texts": ["a"]}}).status_code
        for _ in range(3)
    ]
    assert codes == [202, 202, 429]


def test_monthly_token_budget(api, embedding):
    api.tenant.monthly_token_budget = 10
    api.tenant.save()
    assert submit(api, {"service": "embedding", "input": {"texts": ["x" * 20]}}).status_code == 202
    refused = submit(api, {"service": "embedding", "input": {"texts": ["x" * 40]}})
    assert refused.status_code == 429
    assert refused.json()["error"]["quota"] == "monthly_token_budget"


def test_realtime_jobs_keep_a_reserve_in_a_full_queue(api, make_service):
    make_service("embedding", max_queue_size=10)
    batch = [
        submit(api, {"service": "embedding", "input": {"texts": ["b"]}, "priority": "batch"})
        for _ in range(10)
    ]
    assert [r.status_code for r in batch].count(202) == 9  # 10 % is kept for realtime
    realtime = submit(
        api, {"service": "embedding", "input": {"texts": ["r"]}, "priority": "realtime"}
    )
    assert realtime.status_code == 202
    assert submit(api, {"service": "embedding", "input": {"texts": ["r"]}}).status_code == 503


def test_a_list_that_does_not_fit_the_queue_is_refused_whole(api, make_service):
    make_service("embedding", max_queue_size=4)
    items = [{"service": "embedding", "input": {"texts": [f"t{i}"]}} for i in range(5)]
    response = submit(api, items)
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert Job.objects.count() == 0


def test_a_list_over_two_services_names_the_one_whose_queue_is_full(api, make_service):
    make_service("embedding", name="roomy", max_queue_size=100)
    make_service("embedding", name="small", max_queue_size=2)
    items = [{"service": "roomy", "input": {"texts": [f"e{i}"]}} for i in range(3)] + [
        {"service": "small", "input": {"texts": [f"r{i}"]}} for i in range(3)
    ]
    response = submit(api, items)
    assert response.status_code == 503
    assert "'small'" in response.json()["error"]["message"]
    # Refused whole: the first service's jobs, which fit, were not kept either.
    assert Job.objects.count() == 0 and AuditEvent.objects.count() == 0
    assert submit(api, items[:3]).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_a_single_job_post_stores_it_in_one_round_trip(api, embedding):
    # The capacity check (its lock held until commit), the job and its receipt: one query
    # string, so the lock is never held while the web process waits on the network.
    from django.test.utils import CaptureQueriesContext

    submit(api, {"service": "embedding", "input": {"texts": ["warm"]}})
    with CaptureQueriesContext(connection) as queries:
        response = submit(api, {"service": "embedding", "input": {"texts": ["a"]}})
    assert response.status_code == 202
    writes = [q["sql"] for q in queries.captured_queries if "inference_job" in q["sql"]]
    assert len(writes) == 1, writes
    assert "renq_admit_to_queue" in writes[0] and "INSERT INTO" in writes[0]


@pytest.mark.django_db(transaction=True)
def test_concurrent_submitters_never_overshoot_max_queue_size(make_tenant, make_service):
    # 8 submitters at once, 40 batch jobs, room for 18 (max_queue_size 20 less the realtime
    # reserve): each count must see every job committed before it, or the queue overfills.
    # A service no worker consumes: the suite's session worker would drain its queue.
    service = make_service("embedding", name="unserved-embedding", max_queue_size=20)
    tenant, _ = make_tenant()
    start = threading.Barrier(8)

    def submitter(k: int) -> list[int]:
        codes = []
        try:
            start.wait()
            for i in range(5):
                try:
                    submit_job(
                        tenant=tenant,
                        service_name=service.name,
                        payload={"texts": [f"{k}-{i}"]},
                        priority="batch",
                    )
                    codes.append(202)
                except AdmissionRefused as exc:
                    codes.append(exc.status_code)
        finally:
            connections.close_all()
        return codes

    with ThreadPoolExecutor(8) as pool:
        codes = [code for codes in pool.map(submitter, range(8)) for code in codes]
    assert (codes.count(202), codes.count(503)) == (18, 22)
    assert Job.objects.filter(service=service).count() == 18


@pytest.mark.django_db(transaction=True)
def test_database_down_is_503_with_retry_after_not_500(api, embedding, settings):
    real_port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = "1"  # nothing listens there: as if PostgreSQL stopped
    try:
        response = submit(api, {"service": "embedding", "input": {"texts": ["a"]}})
    finally:
        connection.close()
        connection.settings_dict["PORT"] = real_port
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "service_unavailable"


def test_queue_report_shows_depth_oldest_wait_and_the_preemption_budget(api, make_service):
    make_service("embedding", total_timeout=4)
    for priority in ("batch", "batch", "realtime"):
        submit(api, {"service": "embedding", "input": {"texts": ["a"]}, "priority": priority})
    report = api.get("/api/v1/queues").json()["services"]
    embedding = next(s for s in report if s["service"] == "embedding")
    assert embedding["tiers"]["batch"]["depth"] == 2
    assert embedding["tiers"]["realtime"]["depth"] == 1
    assert embedding["tiers"]["offline"] == {
        "depth": 0,
        "oldest_wait_s": None,
        "completed_last_minute": 0,
    }
    assert embedding["tiers"]["batch"]["oldest_wait_s"] >= 0
    assert embedding["preemption_budget_s"] == 2.0
    assert embedding["pass_target_s"] == 1.6  # the rest of the budget is the realtime dispatch
