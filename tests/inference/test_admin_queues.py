"""The admin's queue pages: a service's queued work by tier and tenant, why it waits, who was
served lately; staff only, a bounded number of queries whatever the backlog."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import Job

pytestmark = pytest.mark.django_db


def queue(tenant, service, tier, n, status="queued", **fields):
    Job.objects.bulk_create(
        Job(
            tenant=tenant,
            service=service,
            tier=tier,
            status=status,
            input={"texts": ["abcdefgh"]},
            **fields,
        )  # fmt: skip
        for _ in range(n)
    )


def lines(response) -> dict[tuple[str, str], object]:
    return {(line.tier, line.tenant): line for line in
            (ln for group in response.context["tiers"] for ln in group["lines"])}  # fmt: skip


def test_the_index_links_the_queue_pages_and_wears_renqs_name(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/queues/"' in page
    assert "renq administration" in page and "Django administration" not in page


def test_a_service_page_shows_work_by_tier_and_tenant_and_why_it_waits(
    admin_client, make_tenant, make_service
):
    acme, _ = make_tenant("acme", plan="pro")
    globex, _ = make_tenant("globex", plan="free")
    service = make_service("embedding")
    other = make_service("embedding", name="other-embedding")
    queue(acme, service, "api", 3)
    queue(acme, service, "batch", 5)
    queue(globex, service, "batch", 2)
    queue(globex, service, "batch", 1, status="running")
    queue(globex, other, "offline", 4)  # another service: not on this page
    now = timezone.now()
    queue(acme, service, "api", 3, status="succeeded", finished_at=now)
    queue(globex, service, "api", 1, status="succeeded", finished_at=now)
    queue(globex, service, "api", 5, status="succeeded", finished_at=now - timedelta(minutes=6))

    response = admin_client.get(f"/admin/queues/{service.name}/")
    assert response.status_code == 200
    found = lines(response)
    assert set(found) == {("api", "acme"), ("batch", "acme"), ("batch", "globex")}
    api, acme_batch, globex_batch = (found["api", "acme"], found["batch", "acme"],
                                     found["batch", "globex"])  # fmt: skip
    assert (api.queued, acme_batch.queued, globex_batch.queued) == (3, 5, 2)
    assert globex_batch.running == 1 and acme_batch.running == 0
    # {"texts": ["abcdefgh"]} is 21 characters of JSON: 5 estimated tokens a job.
    assert api.tokens == 15
    assert api.oldest_wait_s is not None and api.oldest_wait_s >= 0
    # api is the top tier with work and acme is alone in it; batch waits for api's share
    # and, in batch, each tenant for the other.
    assert api.reasons == ["next_in_line"]
    assert acme_batch.reasons == ["tier_share", "tenant_fair_share"]
    assert globex_batch.reasons == ["tier_share", "tenant_fair_share"]
    assert acme_batch.bar_pct == 100.0 and globex_batch.bar_pct == 40.0
    # Served share over the last 5 minutes: 3 of acme's, 1 of globex's (older ones left out).
    served = {row.tenant: (row.plan, row.finished, row.share_pct) for row in
              response.context["served"]}  # fmt: skip
    assert served == {"acme": ("pro", 3, 75.0), "globex": ("free", 1, 25.0)}
    page = response.content.decode()
    for text in ("acme", "globex", "P1 api", "P2 batch", "tier_share", "tenant_fair_share",
                 'style="width: 40.0%"', "75.0"):  # fmt: skip
        assert text in page, text


def test_full_queue_and_tenant_quota_are_reasons(admin_client, make_tenant, make_service):
    acme, _ = make_tenant("acme")
    acme.max_running_jobs = 4
    acme.save()
    globex, _ = make_tenant("globex")
    service = make_service("embedding", max_queue_size=10)
    queue(acme, service, "batch", 3)
    queue(acme, service, "batch", 1, status="running")
    queue(globex, service, "realtime", 5)

    found = lines(admin_client.get(f"/admin/queues/{service.name}/"))
    # 8 queued of 10: batch may fill 9 (realtime alone the last one), so not full yet.
    assert found["batch", "acme"].reasons == ["tenant_quota", "tier_share"]
    assert found["realtime", "globex"].reasons == ["next_in_line"]
    queue(acme, service, "batch", 3)
    found = lines(admin_client.get(f"/admin/queues/{service.name}/"))
    # Batch may fill 9 of 10 (the rest is realtime's); against acme count its own 6 and
    # globex's 5 up to a tenant's share (a quarter of 9: 3), so 9: full. Against globex's
    # realtime, its own 5 and acme's 3 of 10: room.
    assert found["batch", "acme"].reasons == ["queue_full", "tenant_quota", "tier_share"]
    assert found["realtime", "globex"].reasons == ["next_in_line"]


def test_the_pages_cost_a_few_queries_whatever_the_backlog(
    admin_client, make_tenant, make_service, django_assert_max_num_queries
):
    service = make_service("embedding")
    for i in range(12):
        tenant, _ = make_tenant(f"tenant-{i}")
        queue(tenant, service, ("api", "batch", "offline")[i % 3], 2)
        queue(tenant, service, "api", 1, status="succeeded", finished_at=timezone.now())
    # Session and user, then the page's own: service, lines, depth, quotas, served share.
    with django_assert_max_num_queries(8):
        assert admin_client.get(f"/admin/queues/{service.name}/").status_code == 200
    with django_assert_max_num_queries(6):
        assert admin_client.get("/admin/queues/").status_code == 200


def test_the_list_shows_every_service_with_its_fill(admin_client, make_tenant, make_service):
    acme, _ = make_tenant("acme")
    service = make_service("embedding", max_queue_size=8)
    make_service("noop")
    queue(acme, service, "batch", 2)
    response = admin_client.get("/admin/queues/")
    rows = {row["service"].name: row for row in response.context["services"]}
    assert set(rows) == {"embedding", "noop"}
    assert (rows["embedding"]["queued"], rows["embedding"]["fill_pct"]) == (2, 25.0)
    assert rows["noop"]["queued"] == 0
    assert 'href="/admin/queues/embedding/"' in response.content.decode()


def test_only_staff_see_the_queue_pages(client, django_user_model, make_service):
    make_service("embedding")
    for url in ("/admin/queues/", "/admin/queues/embedding/"):
        assert client.get(url).status_code == 302  # to the login page
    user = django_user_model.objects.create_user("customer", password="pw-12345")
    client.force_login(user)
    assert client.get("/admin/queues/").status_code == 302
    user.is_staff = True
    user.save()
    # Staff without the right to view jobs are still refused, and not shown the link.
    assert client.get("/admin/queues/").status_code == 403
    assert client.get("/admin/queues/no-such-service/").status_code == 403
    assert 'href="/admin/queues/"' not in client.get("/admin/").content.decode()
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    assert client.get("/admin/queues/embedding/").status_code == 200
    assert 'href="/admin/queues/"' in client.get("/admin/").content.decode()


def test_an_unknown_service_is_a_404(admin_client):
    assert admin_client.get("/admin/queues/no-such-service/").status_code == 404


def test_the_queue_page_is_read_only(admin_client, make_service):
    make_service("embedding")
    assert admin_client.post("/admin/queues/embedding/").status_code == 405
