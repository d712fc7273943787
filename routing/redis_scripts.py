"""Lua scripts registered once per Redis client and source.

`client.register_script` hashes the source each time it is called; a tracker or breaker built
per job, or a moving average updated per call, would pay that on every request. A script is
run by its SHA and redis-py loads it again should Redis have restarted since.
"""

from __future__ import annotations

import redis
from redis.commands.core import Script

# The scripts of the last client asked for: a process shares one (renq_site.shared_redis).
# One slot, so a client made for a while (a test's) is not kept alive here.
_registered: tuple[redis.Redis, dict[str, Script]] | None = None


def registered_script(client: redis.Redis, source: str) -> Script:
    """`client.register_script(source)`, made once per client and source."""
    global _registered
    registered = _registered
    if registered is None or registered[0] is not client:
        registered = _registered = (client, {})
    scripts = registered[1]
    script = scripts.get(source)
    if script is None:
        # Two threads may both make it: the same script, and either one is kept.
        script = scripts[source] = client.register_script(source)
    return script
