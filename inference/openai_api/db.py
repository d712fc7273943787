"""Database work of the async views, on a small pool of threads that keep their connections.

Django's ORM is synchronous. `sync_to_async` would run it on a thread made per request (and
parked until the request ends, waiting included) with a new Postgres connection each time; a
fixed pool instead bounds the front door's connections per process and reuses them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import ParamSpec, TypeVar

from renq_site.db_sessions import close_old_connections_checked_once_a_second

# Each thread holds at most one Postgres connection (max_connections is 100 by default).
DB_THREADS = int(os.environ.get("RENQ_FRONT_DOOR_DB_THREADS", "8"))

P = ParamSpec("P")
T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="renq-v1-db")


def _run(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    # What Django does around each request: drop a connection that broke or outlived
    # CONN_MAX_AGE, so a Postgres restart costs one reconnect, not a dead thread.
    close_old_connections_checked_once_a_second()
    return fn(*args, **kwargs)


async def in_db_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run the synchronous `fn` (ORM queries, submit_job) on the pool and await its result."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, partial(_run, fn, args, kwargs))
