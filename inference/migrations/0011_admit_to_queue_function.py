from importlib import import_module

from django.db import migrations

# The admission check of the submit path (inference.intake.admission.QueueCapacityCheck): the
# service's advisory lock, the count and the refusal in one call, so that it can run in the
# same round trip as the INSERTs that follow it. Raising aborts the statements after it (one
# transaction); the SQLSTATE and the detail ("service id:depth found") tell the caller why.
# VOLATILE PL/pgSQL takes a new snapshot for the count, after the lock is granted (see 0009).
CREATE = """
CREATE OR REPLACE FUNCTION renq_admit_to_queue(
    p_lock_space integer, p_service_id integer, p_limit integer, p_allowed integer,
    p_jobs integer
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    depth integer;
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock_space, p_service_id);
    SELECT count(*) INTO depth FROM (
        SELECT 1 FROM inference_job
        WHERE service_id = p_service_id AND status = 'queued'
        LIMIT p_limit
    ) AS queued;
    IF depth + p_jobs > p_allowed THEN
        RAISE EXCEPTION 'queue of service % is full', p_service_id
            USING ERRCODE = 'RQ503', DETAIL = p_service_id || ':' || depth;
    END IF;
    RETURN depth;
END
$$;
"""
DROP = "DROP FUNCTION IF EXISTS renq_admit_to_queue(integer, integer, integer, integer, integer);"

# It replaces 0009's lock-and-count, which nothing calls any more (restored on reverse).
_0009 = import_module("inference.migrations.0009_queue_depth_function")


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0010_job_index_diet"),
    ]

    operations = [
        migrations.RunSQL(CREATE, DROP),
        migrations.RunSQL(_0009.DROP, _0009.CREATE),
    ]
