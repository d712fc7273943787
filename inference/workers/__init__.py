"""The processes that carry jobs out, one module each:

- `gpu`: the GPU worker's batch runner (`celery worker -Q <service>.<tier>…`),
  with `tier_reader` (pulls the rest of a batch in tier order) and `warmup` (loads models);
- `cloud`: the I/O worker's attempt on a cloud backend (`-Q io.<tier>…`, thread pool);
- `sweeper`: the control worker's periodic repairs (`-Q renq.control -B`).

Celery tasks (inference.tasks) are thin wrappers over these.
"""

from __future__ import annotations

import os
import socket


def worker_identity() -> str:
    """host:pid of this process, stored on the jobs it claims."""
    return f"{socket.gethostname()}:{os.getpid()}"
