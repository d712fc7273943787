"""The submit path's own INSERT sends each value as the ORM would prepare it for saving."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from inference.intake.row_writer import insert_statement
from inference.models import Job

pytestmark = pytest.mark.django_db


def test_every_value_is_what_the_orm_would_send(make_service, make_tenant):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    job = Job(
        tenant=tenant,
        service=service,
        tier="batch",
        input={"texts": ["ä", 'q"'], "n": 1},
        created_at=now,
        published_at=now,
        deadline_at=now + timedelta(seconds=5),
        result_vectors=b"\x00\x01",
        idempotency_key="k",
    )
    sql, params = insert_statement([job])
    fields = list(Job._meta.concrete_fields)
    expected = [f.get_db_prep_save(f.pre_save(job, True), connection) for f in fields]
    assert sql.count("%s") == len(params) == len(expected)
    # Compared as the SQL literals psycopg2 sends (JSON and bytes are adapter objects).
    connection.ensure_connection()
    cursor = connection.connection.cursor()
    assert [cursor.mogrify("%s", [p]) for p in params] == [
        cursor.mogrify("%s", [e]) for e in expected
    ]
    assert params[fields.index(Job._meta.get_field("finished_at"))] is None


def test_a_job_built_by_position_has_every_field_a_keyword_built_one_has(
    make_service, make_tenant
):
    from inference.intake.submission import NewJobRow

    service = make_service("embedding")
    tenant, _ = make_tenant()
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    fields = dict(
        tier="api", message_priority=2, input={"texts": ["x"]}, created_at=now, published_at=now
    )
    built = NewJobRow().build(tenant, service, **fields)
    expected = Job(tenant=tenant, service=service, **fields)
    for field in Job._meta.concrete_fields:
        if field.name != "id":
            assert getattr(built, field.attname) == getattr(expected, field.attname), field.name
    assert built.pk is not None and built.pk != NewJobRow().build(tenant, service, **fields).pk
    assert built._state.adding
    with django_assert_no_queries():
        assert (built.tenant, built.service) == (tenant, service)


def django_assert_no_queries():
    from django.test.utils import CaptureQueriesContext

    class _NoQueries(CaptureQueriesContext):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            assert not self.captured_queries, self.captured_queries

    return _NoQueries(connection)


@pytest.mark.django_db(transaction=True)
def test_a_connection_broken_under_the_statements_says_their_outcome_is_unknown():
    # The server ended the session while it ran them (as a stopping server does): whether
    # they committed cannot be known from this side.
    import threading

    from django.db import connections

    from inference.intake.row_writer import OutcomeUnknown, run_in_one_round_trip

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]

    def terminate() -> None:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(0.3); SELECT pg_terminate_backend(%s)", [pid])
        finally:
            other.close()

    killer = threading.Thread(target=terminate)
    killer.start()
    try:
        with pytest.raises(OutcomeUnknown):
            run_in_one_round_trip([("SELECT pg_sleep(%s)", [5])])
    finally:
        killer.join()
        connection.close()


@pytest.mark.django_db
def test_a_statement_postgres_refused_is_not_an_unknown_outcome():
    from django.db import DatabaseError

    from inference.intake.row_writer import OutcomeUnknown, run_in_one_round_trip

    with pytest.raises(DatabaseError) as refused:
        run_in_one_round_trip([("SELECT 1/0", [])])
    assert not isinstance(refused.value, OutcomeUnknown)
