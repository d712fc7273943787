"""Statements PostgreSQL plans once per session (PREPARE / EXECUTE) instead of on every call.

A worker's claim and store run between every two forward passes, and PostgreSQL parsed and
planned each anew: the claim's three-table UPDATE with its long RETURNING list took longer to
plan than to run. A prepared statement is planned for its first five executions, then once
more as a generic plan that later executions reuse.

A statement is prepared on its first use on each connection, in a round trip of its own, so a
failed PREPARE is never taken for a done one. A rollback does not undo a PREPARE, and a new
connection (after a PostgreSQL restart) is a new object here, so it prepares again.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence

_PARAMETER = re.compile(r"%\((\w+)\)s")


class PreparedStatement:
    """`sql` with named parameters (`%(name)s`), and each parameter's PostgreSQL type in the
    order EXECUTE passes them."""

    def __init__(self, name: str, sql: str, types: Sequence[tuple[str, str]]):
        self.name = name
        position = {param: n for n, (param, _) in enumerate(types, start=1)}
        missing = set(_PARAMETER.findall(sql)) - set(position)
        if missing:
            raise ValueError(f"{name}: no type given for {sorted(missing)}")
        body = _PARAMETER.sub(lambda m: f"${position[m.group(1)]}", sql)
        declared = ", ".join(pg_type for _, pg_type in types)
        self.prepare_sql = f"PREPARE {name} ({declared}) AS {body}"
        arguments = ", ".join(f"%({param})s::{pg_type}" for param, pg_type in types)
        self.execute_sql = f"EXECUTE {name} ({arguments})"
        # The connections (psycopg2's own objects) this statement is prepared on.
        self._prepared_on: weakref.WeakSet = weakref.WeakSet()

    def sql_for(self, cursor) -> str:
        """The EXECUTE to send on `cursor` (a Django cursor), preparing the statement on its
        connection first if it is not yet."""
        raw = cursor.cursor.connection
        if raw not in self._prepared_on:
            cursor.execute(self.prepare_sql)
            self._prepared_on.add(raw)
        return self.execute_sql
