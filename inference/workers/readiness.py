"""Worker readiness: models loaded and queues consumed, as a container probe can ask it.

Each pool process writes `<RENQ_READY_DIR>/<pid>.json` once its warm-up is over (which models
loaded, which failed). `probe_worker("embedding@host")` asks the worker over the broker which
queues it consumes and which pool processes it has (Celery's inspect `active_queues` and
`stats`), then reads those processes' files: ready when it answers, consumes its queues, and
every pool process of a GPU worker loaded every model. `manage.py renq_probe worker --name …`
turns that into exit 0/1 for docker compose and Kubernetes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from inference.dispatch.queues import served_service_names
from renq_site.celery import app


def ready_dir() -> Path:
    return Path(os.environ.get("RENQ_READY_DIR") or Path(settings.BASE_DIR) / ".run" / "ready")


def ready_file(pid: int) -> Path:
    return ready_dir() / f"{pid}.json"


def forget_process_readiness() -> None:
    """This pool process starts or stops: a file an earlier process of the same pid left (pids
    are reused, and a restarted container counts from 1 again) must not make it look warm
    while it is still loading its models."""
    ready_file(os.getpid()).unlink(missing_ok=True)


def mark_process_ready(*, failed: list[str]) -> None:
    """Called by the warm-up when it is over; `failed` lists services whose model did not load."""
    directory = ready_dir()
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), "failed": failed, "at": time.time()}))
    tmp.replace(ready_file(os.getpid()))  # atomic: a probe never reads half a file


@dataclass(frozen=True)
class Readiness:
    ready: bool
    detail: str


def probe_worker(name: str, *, timeout_s: float = 5.0) -> Readiness:
    inspect = app.control.inspect([name], timeout=timeout_s)
    queues = (inspect.active_queues() or {}).get(name)
    if queues is None:
        return Readiness(False, f"{name} did not answer (not running, or not on the broker)")
    if not queues:
        return Readiness(False, f"{name} consumes no queue")
    names = sorted(q["name"] for q in queues)
    services = served_service_names(set(names))
    if not services:  # I/O and control workers load no model
        return Readiness(True, f"{name} consumes {', '.join(names)}")
    stats = (inspect.stats() or {}).get(name) or {}
    pids = (stats.get("pool") or {}).get("processes") or []
    if not pids:
        return Readiness(False, f"{name} reports no pool processes")
    for pid in pids:
        try:
            state = json.loads(ready_file(pid).read_text())
        except (OSError, ValueError):
            return Readiness(False, f"pool process {pid} has not finished loading its models")
        if state.get("failed"):
            failed = ", ".join(state["failed"])
            return Readiness(False, f"pool process {pid} could not load the model of {failed}")
    return Readiness(
        True, f"{name}: {len(pids)} pool process(es) warm for {', '.join(sorted(services))}"
    )
