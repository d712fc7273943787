from django.db import migrations

# The admission check's lock and count in one round trip (inference.intake.admission). A VOLATILE
# PL/pgSQL function takes a new snapshot for each query it runs under READ COMMITTED, so the
# count, taken after the lock, sees every job the lock's previous holder committed; in one plain
# statement the count would use the statement's snapshot, taken before the lock was granted.
CREATE = """
CREATE OR REPLACE FUNCTION renq_lock_queued_depth(
    p_lock_space integer, p_service_id integer, p_limit integer
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock_space, p_service_id);
    RETURN (
        SELECT count(*) FROM (
            SELECT 1 FROM inference_job
            WHERE service_id = p_service_id AND status = 'queued'
            LIMIT p_limit
        ) AS queued
    );
END
$$;
"""
DROP = "DROP FUNCTION IF EXISTS renq_lock_queued_depth(integer, integer, integer);"


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0008_queued_jobs_by_age"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP)]
