"""How many rows of the job table and its indexes a call reads: this session's own counters
(pg_stat_get_xact_tuples_returned, not yet reported), so a test can say a read stays small
however deep the queue."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import connection

from inference.models import Job

T = TypeVar("T")

_ROWS_READ = (
    "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)"
    " + (SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index"
    "    WHERE indrelid = %s::regclass)"
)


def job_rows_read(call: Callable[[], T]) -> tuple[int, T]:
    """The rows `call` read (in this transaction), and what it returned."""
    with connection.cursor() as cursor:
        cursor.execute(_ROWS_READ, [Job._meta.db_table] * 2)
        (before,) = cursor.fetchone()
        answer = call()
        cursor.execute(_ROWS_READ, [Job._meta.db_table] * 2)
        (after,) = cursor.fetchone()
    return after - before, answer
