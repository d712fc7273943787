"""Admission reads each tenant's queued jobs only as far as they count (Issue #29).

renq_admit_to_queue (0015) counted every queued job of the service, by tenant, under the
service's advisory lock: a bulk job's pieces, admitted past max_queue_size by their own
budget, made every other submission to the service read all of them in turn
(`bench/admission_depth.py --backlog bulk`, docs/performance.md). Another tenant's jobs
count only up to the share, and the tenant's own past the allowance refuse it whatever else
is queued, so the count now stops there. A queue up to the allowance deep is counted as
before, in one scan; a deeper one tenant by tenant, walking the service's queued tenants down
the active index (one probe each, hence tenant_id in it), each read only as far as it
counts. The refusal's detail is "service id:jobs counted against the tenant".

The walk is planned once per session, on that index: planned per call (PL/pgSQL's custom
plans, which it kept choosing) its planning outweighed its reads over a deep backlog, and a
generic plan free to pick read the table from its start or walked a tenant's whole history.
Those settings last for the walk only: as function options every submission would pay for
them.

The index is rebuilt concurrently, before the old one goes, as 0010 did."""

from importlib import import_module

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

# 0015's count of every queued job comes back on reverse.
_0015 = import_module("inference.migrations.0015_admit_by_tenant_share")

CREATE = """
CREATE OR REPLACE FUNCTION renq_admit_to_queue(
    p_lock_space integer, p_service_id integer, p_tenant_id integer, p_allowed integer,
    p_share integer, p_jobs integer, p_bulk boolean
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    depth integer;
    own integer;
    others integer;
    seqscan text := current_setting('enable_seqscan');
    plan_mode text := current_setting('plan_cache_mode');
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock_space, p_service_id);
    -- A queue up to the allowance deep: every queued job, by tenant, in one scan.
    SELECT coalesce(sum(n) FILTER (WHERE tenant_id = p_tenant_id), 0),
           coalesce(sum(least(n, p_share)) FILTER (WHERE tenant_id <> p_tenant_id), 0),
           coalesce(sum(n), 0)
      INTO own, others, depth
      FROM (
          SELECT tenant_id, count(*) AS n FROM (
              SELECT tenant_id FROM inference_job
               WHERE service_id = p_service_id AND status = 'queued' LIMIT p_allowed + 1
          ) AS shallow GROUP BY tenant_id
      ) AS by_tenant;
    IF depth > p_allowed THEN
        -- Deeper: each tenant's jobs as far as they count, planned once, on the index.
        PERFORM set_config('enable_seqscan', 'off', true),
                set_config('plan_cache_mode', 'force_generic_plan', true);
        WITH RECURSIVE queued(tenant_id) AS (
            (SELECT tenant_id FROM inference_job
              WHERE service_id = p_service_id AND status = 'queued'
              ORDER BY tenant_id LIMIT 1)
            UNION ALL
            SELECT (SELECT j.tenant_id FROM inference_job AS j
                     WHERE j.service_id = p_service_id AND j.status = 'queued'
                       AND j.tenant_id > q.tenant_id
                     ORDER BY j.tenant_id LIMIT 1)
              FROM queued AS q WHERE q.tenant_id IS NOT NULL
        ), counted AS (
            SELECT q.tenant_id = p_tenant_id AS mine,
                   (SELECT count(*) FROM (
                       SELECT 1 FROM inference_job AS j
                        WHERE j.service_id = p_service_id AND j.status = 'queued'
                          AND j.tenant_id = q.tenant_id
                        LIMIT CASE WHEN q.tenant_id = p_tenant_id THEN p_allowed + 1
                                   ELSE p_share END
                   ) AS rows) AS n
              FROM queued AS q WHERE q.tenant_id IS NOT NULL
        )
        SELECT coalesce(sum(n) FILTER (WHERE mine), 0),
               coalesce(sum(n) FILTER (WHERE NOT mine), 0)
          INTO own, others FROM counted;
        PERFORM set_config('enable_seqscan', seqscan, true),
                set_config('plan_cache_mode', plan_mode, true);
    END IF;
    IF (CASE WHEN p_bulk THEN others + greatest(own, least(own + p_jobs, p_share))
             ELSE others + own + p_jobs END) > p_allowed THEN
        RAISE EXCEPTION 'queue of service % is full', p_service_id
            USING ERRCODE = 'RQ503', DETAIL = p_service_id || ':' || (others + own);
    END IF;
    RETURN others + own;
END
$$;
"""


class Migration(migrations.Migration):
    # CREATE/DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("inference", "0016_hold_back_for_fair_turn"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "running"])),
                fields=["service", "status", "tenant"],
                name="inference_job_active_tenant",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="inference_job_active"),
        migrations.RunSQL(CREATE, _0015.CREATE),
    ]
