"""The tiers' target waits come from config.yaml `tiers.*.target_wait_s`: the router's spill-over
target and the autoscaler's are one function, cached and re-read after a configuration change."""

from __future__ import annotations

import pytest
from django.db import connection

from inference.config.changes import _BUMP_SQL, bump_config_change
from inference.config.models import SchedulerSettings
from inference.dispatch.placement import ServiceWorkerProbe, tier_target_s
from inference.dispatch.scaling import recommend
from inference.models import Job
from routing.stats import throughput_key, update_ewma

pytestmark = pytest.mark.django_db


@pytest.fixture
def service(make_service):
    service = make_service("embedding", worker_count=4, queue_timeout=5, total_timeout=10)
    update_ewma(throughput_key(service.name), 10.0)  # one worker: 10 jobs/s, measured
    return service


def configure_tiers(**tiers) -> None:
    SchedulerSettings.objects.update_or_create(
        pk=SchedulerSettings.SINGLETON_PK, defaults={"tiers": tiers}
    )


def test_without_a_config_the_targets_are_the_defaults(service):
    assert tier_target_s(service, "batch") == 15 * 60.0
    assert tier_target_s(service, "offline") == 6 * 3600.0
    assert tier_target_s(service, "api") == tier_target_s(service, "realtime") == 5.0


def test_batch_and_offline_targets_come_from_the_config(service):
    configure_tiers(batch={"target_wait_s": 60.0}, offline={"target_wait_s": 600.0})
    assert tier_target_s(service, "batch") == 60.0
    assert tier_target_s(service, "offline") == 600.0
    # What the router is told for a batch job.
    assert ServiceWorkerProbe(service, "batch").predicted_wait().target_s == 60.0


def test_an_interactive_target_may_be_tighter_than_the_service_timeouts_never_looser(service):
    configure_tiers(api={"target_wait_s": 1.0}, realtime={"target_wait_s": 60.0})
    assert tier_target_s(service, "api") == 1.0
    assert tier_target_s(service, "realtime") == 5.0  # min(queue_timeout, total_timeout)


def test_a_change_made_elsewhere_is_seen_through_the_change_marker(service):
    assert tier_target_s(service, "batch") == 15 * 60.0  # now cached
    # Another process's change: the row and the marker move, and this process gets no signal.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE renq_config_schedulersettings SET tiers = %s WHERE id = %s",
            ['{"batch": {"target_wait_s": 120.0}}', SchedulerSettings.SINGLETON_PK],
        )
        if cursor.rowcount == 0:
            cursor.execute(
                "INSERT INTO renq_config_schedulersettings (id, tiers, updated_at) "
                "VALUES (%s, %s, now())",
                [SchedulerSettings.SINGLETON_PK, '{"batch": {"target_wait_s": 120.0}}'],
            )
        cursor.execute(_BUMP_SQL)
    assert tier_target_s(service, "batch") == 120.0
    # And a change saved in this process is seen at once.
    configure_tiers(batch={"target_wait_s": 30.0})
    assert tier_target_s(service, "batch") == 30.0
    bump_config_change()
    assert tier_target_s(service, "batch") == 30.0


def test_the_autoscaler_sizes_workers_for_the_routers_target(service, make_tenant):
    tenant, _ = make_tenant()
    Job.objects.bulk_create(
        Job(tenant=tenant, service=service, tier="api", input={"texts": ["x"]}) for _ in range(120)
    )
    # A target longer than the service's queue_timeout (5 s) would let api jobs expire while
    # waiting: both the router and the autoscaler hold api to 5 s.
    configure_tiers(api={"target_wait_s": 60.0})
    assert tier_target_s(service, "api") == 5.0
    assert recommend(service).needed == 3  # 120 jobs / 5 s / 10 jobs/s per worker
