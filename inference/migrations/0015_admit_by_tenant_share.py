from importlib import import_module

from django.db import migrations

# The admission check of the submit path (inference.intake.admission.QueueCapacityCheck), now
# by tenant (Issue #27): under the service's advisory lock, the tenant's own queued jobs count
# in full, each other tenant's only up to p_share, so one tenant's backlog cannot fill the
# queue the others need. A bulk job (p_bulk) is admitted by its own budget: its pieces count
# only up to p_share with the tenant's queued jobs. The rows counted are the queue depth's
# (inference.metrics.queue_depth): the service's queued jobs, bulk pieces included. The
# detail names "service id:depth:jobs counted against the tenant". VOLATILE PL/pgSQL takes a
# new snapshot for the count, after the lock is granted (see 0009).
CREATE = """
CREATE OR REPLACE FUNCTION renq_admit_to_queue(
    p_lock_space integer, p_service_id integer, p_tenant_id integer, p_allowed integer,
    p_share integer, p_jobs integer, p_bulk boolean
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    own integer;
    others integer;
    depth integer;
    counted integer;
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock_space, p_service_id);
    SELECT coalesce(sum(n) FILTER (WHERE tenant_id = p_tenant_id), 0),
           coalesce(sum(least(n, p_share)) FILTER (WHERE tenant_id <> p_tenant_id), 0),
           coalesce(sum(n), 0)
      INTO own, others, depth
      FROM (
          SELECT tenant_id, count(*) AS n FROM inference_job
          WHERE service_id = p_service_id AND status = 'queued'
          GROUP BY tenant_id
      ) AS queued;
    counted := others + own;
    IF (CASE WHEN p_bulk THEN others + greatest(own, least(own + p_jobs, p_share))
             ELSE counted + p_jobs END) > p_allowed THEN
        RAISE EXCEPTION 'queue of service % is full', p_service_id
            USING ERRCODE = 'RQ503', DETAIL = p_service_id || ':' || depth || ':' || counted;
    END IF;
    RETURN depth;
END
$$;
"""
DROP = (
    "DROP FUNCTION IF EXISTS renq_admit_to_queue("
    "integer, integer, integer, integer, integer, integer, boolean);"
)

# It replaces 0011's count of every queued job against one limit (restored on reverse).
_0011 = import_module("inference.migrations.0011_admit_to_queue_function")


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0014_claim_leases"),
    ]

    operations = [
        migrations.RunSQL(_0011.DROP, _0011.CREATE),
        migrations.RunSQL(CREATE, DROP),
    ]
