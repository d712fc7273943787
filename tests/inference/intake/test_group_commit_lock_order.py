"""A group commit takes its members' advisory locks in ascending key order, as a lone
submission does, so two transactions never wait on each other's locks in a circle."""

from __future__ import annotations

from inference.intake.group_commit import GroupCommit, _Submission

SERVICE, TENANT = 7_301, 7_302  # the admission checks' lock spaces


def _committed_statements(*lock_orders: tuple) -> list:
    executed: list = []
    group_commit = GroupCommit(executed.extend, lambda jobs: None)
    group = [_Submission([(f"member {i}", [])], [], order) for i, order in enumerate(lock_orders)]
    assert group_commit._commit(group, group[0])
    return executed


def test_members_whose_locks_follow_one_another_in_order_run_as_they_are():
    statements = _committed_statements(
        ((SERVICE, 2), (TENANT, 5)), ((SERVICE, 1),), ((SERVICE, 2), (TENANT, 5))
    )
    # Sorted by their locks: service 1, then service 2 and tenant 5 (twice: held already).
    assert [sql for sql, _ in statements] == ["member 1", "member 0", "member 2"]


def test_a_group_whose_members_would_lock_out_of_order_takes_every_lock_first():
    # Alone, each takes its service's lock, then its tenant's: in ascending order. One after
    # the other they would take tenant 9 before service 2, and a lone submission of tenant 9
    # to service 2 takes them the other way round.
    statements = _committed_statements(((SERVICE, 1), (TENANT, 9)), ((SERVICE, 2), (TENANT, 3)))
    (sql, params), *members = statements
    assert sql.count("pg_advisory_xact_lock") == 4
    assert params == [SERVICE, 1, SERVICE, 2, TENANT, 3, TENANT, 9]
    assert [sql for sql, _ in members] == ["member 0", "member 1"]
