"""The admin's job list: wait/inference times, backend and attempts at a glance; filters."""

from __future__ import annotations

import pytest

from inference.models import Job
from routing.models import Backend, JobRoute

pytestmark = pytest.mark.django_db


def test_job_list_shows_backend_and_times_and_filters_by_backend(admin_client, make_tenant,
                                                                   make_service):  # fmt: skip
    tenant, _ = make_tenant()
    service = make_service("embedding")
    cloud = Backend.objects.create(name="paid-x", kind="openai", service_kinds=["embedding"])
    routed = Job.objects.create(tenant=tenant, service=service, tier="batch", input={},
                                inference_ms=12.345, attempts=2)  # fmt: skip
    JobRoute.objects.create(job=routed, backend=cloud, reason="spill-over")
    local = Backend.objects.create(name="local-x", kind="local", service_kinds=["embedding"])
    other = Job.objects.create(tenant=tenant, service=service, tier="api", input={})
    JobRoute.objects.create(job=other, backend=local, reason="local first")
    Job.objects.create(tenant=tenant, service=service, tier="api", input={})  # no route

    page = admin_client.get("/admin/inference/job/").content.decode().lower()
    # (The admin shows a related filter once it has two choices.)
    for text in (
        "paid-x",
        "local-x",
        "local (no route)",
        "12.3",
        "inference (ms)",
        "queue wait (ms)",
    ):
        assert text in page
    filtered = admin_client.get(f"/admin/inference/job/?route__backend__id__exact={cloud.pk}")
    assert filtered.status_code == 200
    assert list(filtered.context["cl"].result_list) == [routed]
    for query in ("tier__exact=batch", "status__exact=queued", f"tenant__id__exact={tenant.pk}",
                  f"service__id__exact={service.pk}"):  # fmt: skip
        assert admin_client.get(f"/admin/inference/job/?{query}").status_code == 200


def test_job_page_summarises_the_vectors_instead_of_printing_bytes(admin_client, make_tenant,
                                                                   make_service):  # fmt: skip
    from inference.jobs.vectors import split_result

    tenant, _ = make_tenant()
    result, packed = split_result({"embeddings": [[0.5] * 4] * 3, "dim": 4})
    job = Job.objects.create(tenant=tenant, service=make_service("embedding"), tier="api",
                             input={"texts": ["a", "b", "c"]}, status="succeeded",
                             result=result, result_vectors=packed)  # fmt: skip
    page = admin_client.get(f"/admin/inference/job/{job.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "3 × 4 float32 (48 bytes)" in text and "memory at" not in text
