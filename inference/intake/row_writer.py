"""New rows of several models in one round trip: the submit path's INSERTs.

`bulk_create` builds an InsertQuery and compiles it per call, and sends each model's rows
separately: CPU and a round trip per model on every POST, the hottest path. Here the
statement comes from the models' own fields (a changed model changes it) and the values are
prepared as the ORM prepares them for saving. No signals, as with bulk_create.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime

from django.db import OperationalError, connections
from django.db.models import Model

logger = logging.getLogger(__name__)


def insert_statement(rows: Sequence[Model], using: str = "default") -> tuple[str, list]:
    """One multi-row INSERT of new instances of one model: every concrete field but a primary
    key the database generates (AutoField)."""
    connection = connections[using]
    head, row, prepared = _insert_shape(type(rows[0]), using)
    sql = f"{head}{', '.join([row] * len(rows))}"
    params = [_db_value(f, obj, connection, as_is) for obj in rows for f, as_is in prepared]
    return sql, params


@functools.cache
def _insert_shape(model: type[Model], using: str) -> tuple[str, str, list[tuple]]:
    """A model's INSERT up to VALUES, one row's placeholders, and its fields with the type
    each is sent as: fixed once the models are loaded, so made once, not per submission."""
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not (f.primary_key and f.db_returning)]
    quote = connections[using].ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    row = f"({', '.join(['%s'] * len(fields))})"
    head = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES "
    return head, row, [(f, _SENT_AS_IS.get(_column_type(f))) for f in fields]


# Python types a field's preparation for PostgreSQL returns unchanged (str for a CharField,
# an int for an integer column, a UUID for a native uuid column), by the field's
# internal type; a ForeignKey goes by the field it points at.
_SENT_AS_IS = {
    "CharField": str,
    "TextField": str,
    "IntegerField": int,
    "BigIntegerField": int,
    "SmallIntegerField": int,
    "PositiveIntegerField": int,
    "PositiveSmallIntegerField": int,
    "PositiveBigIntegerField": int,
    "AutoField": int,
    "BigAutoField": int,
    "BooleanField": bool,
    "FloatField": float,
    "UUIDField": uuid.UUID,
}


def _column_type(field) -> str:
    while field.is_relation:
        field = field.target_field
    return field.get_internal_type()


def _db_value(field, obj: Model, connection, as_is: type | None):
    value = field.pre_save(obj, True)
    # NULL, an aware datetime, and a value already of the type the column's preparation
    # returns, are sent as they are: what the ORM's preparation returns for them, without
    # its calls, which a job's many timestamps would otherwise pay per job.
    if value is None or type(value) is as_is:
        return value
    if type(value) is datetime and value.tzinfo is not None:
        return value
    return field.get_db_prep_save(value, connection)


class OutcomeUnknown(OperationalError):
    """The connection broke after the statements were sent: they may have committed."""


def run_in_one_round_trip(statements: Sequence[tuple[str, list]], using: str = "default") -> None:
    """Several statements in one execute. Inside a transaction they are part of it; outside
    one, PostgreSQL runs a query string of several statements as one implicit transaction:
    they commit together, or an error in any of them rolls them all back. Raises
    OutcomeUnknown when the connection broke with them sent (a connection that could not
    be opened raises before anything is sent)."""
    if not statements:
        return
    with connections[using].cursor() as cursor:
        try:
            cursor.execute(
                ";\n".join(sql for sql, _ in statements), [p for _, ps in statements for p in ps]
            )
        except OperationalError as exc:
            if may_have_committed(exc):
                raise OutcomeUnknown(*exc.args) from exc
            raise


# How often a wait for the WAL flush looks again (the WAL writer flushes every
# wal_writer_delay, 200 ms by default), and how long it looks at most.
FLUSH_POLL_S = 0.01
FLUSH_WAIT_MAX_S = 5.0


def wait_until_flushed(using: str = "default") -> bool:
    """Return once every commit made so far is on disk, so one made without waiting for the
    WAL flush (a waiting caller's submission) is durable before its caller is told the job
    was accepted without an outcome. False: not flushed within FLUSH_WAIT_MAX_S."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (written,) = cursor.fetchone()
        deadline = time.monotonic() + FLUSH_WAIT_MAX_S
        while True:
            cursor.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [written])
            if cursor.fetchone()[0]:
                return True
            if time.monotonic() > deadline:
                logger.warning("WAL not flushed past %s in %g s", written, FLUSH_WAIT_MAX_S)
                return False
            time.sleep(FLUSH_POLL_S)


def may_have_committed(exc: OperationalError) -> bool:
    """Whether a COMMIT sent before this error may have happened: no SQLSTATE (the socket
    closed under it) or class 57P (the server was shut down or crashed while running it)."""
    code = getattr(exc.__cause__, "pgcode", None)
    return code is None or code.startswith("57P")


def insert_statements(*groups: Sequence[Model], using: str = "default") -> list[tuple[str, list]]:
    """One INSERT per non-empty group (new instances of one model)."""
    return [insert_statement(rows, using) for rows in groups if rows]


def mark_saved(*groups: Sequence[Model], using: str = "default") -> None:
    """The instances are rows now (as save() leaves them)."""
    for rows in groups:
        for obj in rows:
            obj._state.adding = False
            obj._state.db = using


def insert_new_rows(*groups: Sequence[Model], using: str = "default") -> None:
    """Insert each group (new instances of one model) in one execute: inside a transaction,
    these rows and the transaction's other statements commit or roll back together."""
    run_in_one_round_trip(insert_statements(*groups, using=using), using)
    mark_saved(*groups, using=using)
