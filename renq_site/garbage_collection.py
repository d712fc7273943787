"""The cyclic garbage collector in long-lived server processes (web and worker).

A Django + Celery process holds a few hundred thousand objects from its start (modules, the
models' metadata, URL patterns, a model's tokenizer) that live as long as it does, and every
collection of the oldest generation walks all of them again. Freezing them once the process
is ready moves them to a permanent generation that collections skip: the use the Python docs
give gc.freeze() for in servers that fork. What the process allocates afterwards is collected
as usual, and each full collection costs what the process does, not what it loaded.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect once, then exempt everything alive now from later collections. Call it last
    in a process's start, after what it loads to serve."""
    gc.collect()
    gc.freeze()
