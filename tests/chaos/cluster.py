"""The system under test for the chaos suite: real processes (gunicorn, GPU, control and I/O
Celery workers) reaching PostgreSQL, RabbitMQ and Redis only through fault proxies
(tests/chaos/tcp_proxy.py); HTTP clients submitting over the real REST API; and the ledger
that says, per scenario, what was accepted, completed, failed, lost and run twice."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

import requests

from tests.chaos.tcp_proxy import FaultProxy
from tests.conftest import TEST_QUEUE_PREFIX
from tests.renq_site.helpers import (
    RUN_DIR,
    VENV_BIN,
    ChildProcess,
    child_database_url,
    free_port,
)

REAL_PORTS = {"postgres": 5432, "rabbitmq": 5672, "redis": 6379}
# The chaos processes' queues: apart from the test prefix's, which other fixtures' workers use.
CHAOS_QUEUE_PREFIX = f"{TEST_QUEUE_PREFIX}chaos."
REPORT_PATH = RUN_DIR / "chaos-report.txt"


def _redis_db() -> int:
    from tests.conftest import TEST_REDIS_URL

    return int(TEST_REDIS_URL.rsplit("/", 1)[-1] or 0)


def celery_worker_argv(
    node: str, queues: Iterable[str], concurrency: int, pool: str, *, beat: bool = False
) -> list[str]:
    """A renq Celery worker's command line, as the suites' hosts start it."""
    argv = [
        str(VENV_BIN / "celery"),
        "-A",
        "renq_site",
        "worker",
        "-n",
        f"{node}-{uuid.uuid4().hex[:6]}@%h",
        "-Q",
        ",".join(queues),
        "--concurrency",
        str(concurrency),
        "--pool",
        pool,
        "--without-mingle",
        "--without-gossip",
        "-l",
        "info",
    ]
    if beat:
        # Its own schedule file: two suites' beats never share one.
        argv += ["-B", "-s", f".run/{node.split('-')[0]}-beat-{os.getpid()}"]
    return argv


class Proxies:
    """One fault proxy per dependency, for the whole chaos module."""

    def __init__(self):
        self.postgres = FaultProxy(REAL_PORTS["postgres"], name="postgres")
        self.rabbitmq = FaultProxy(REAL_PORTS["rabbitmq"], name="rabbitmq")
        self.redis = FaultProxy(REAL_PORTS["redis"], name="redis")

    def all(self) -> list[FaultProxy]:
        return [self.postgres, self.rabbitmq, self.redis]

    def restore_all(self) -> None:
        for proxy in self.all():
            proxy.restore()

    def stop(self) -> None:
        for proxy in self.all():
            proxy.stop()

    def child_env(self) -> dict[str, str]:
        """Every dependency of a child process through its proxy."""
        database = child_database_url().replace(":5432/", f":{self.postgres.port}/")
        redis_url = f"redis://127.0.0.1:{self.redis.port}/{_redis_db()}"
        return {
            "DATABASE_URL": database,
            "CELERY_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{self.rabbitmq.port}//",
            "CELERY_RESULT_BACKEND": redis_url,
            "RENQ_REDIS_URL": redis_url,
        }


class Cluster:
    """renq's processes for one chaos module. Children run in their own process groups, so a
    kill -9 takes a whole worker (main process and pool children) as a machine crash would."""

    def __init__(self, proxies: Proxies, **env: str):
        self.proxies = proxies
        self.env = {
            **proxies.child_env(),
            "RENQ_QUEUE_PREFIX": CHAOS_QUEUE_PREFIX,
            "RENQ_TORCH_THREADS": "1",
            "RENQ_SWEEP_INTERVAL_S": "1",
            # Short, so scenario 6 need not wait half a minute (noop jobs have no route and are
            # never rescued; the stranded rescue looks only at routed jobs).
            "RENQ_STRANDED_AFTER_S": "3",
            # Longer than SETTLED_WITHIN_S (test_scenarios): a job that needed the lost-message
            # sweep (its message taken and never handed back) fails its scenario.
            "RENQ_LOST_MESSAGE_AFTER_S": "60",
            "RENQ_LOG_LEVEL": "WARNING",
            **env,
        }
        self.children: dict[str, ChildProcess] = {}
        self.web_url = ""

    # --- processes -----------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], env: dict | None = None) -> ChildProcess:
        self.stop(name)
        child = ChildProcess(f"chaos-{name}", argv, env={**self.env, **(env or {})})
        self.children[name] = child
        return child

    def web(self, workers: int = 1) -> str:
        port = free_port()
        child = self._start(
            "web",
            [
                str(VENV_BIN / "gunicorn"),
                "renq_site.asgi:application",
                "-k",
                "uvicorn_worker.UvicornWorker",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                str(workers),
                "--timeout",
                "60",
            ],
        )
        self.web_url = f"http://127.0.0.1:{port}"
        child.wait_until(
            lambda: requests.get(f"{self.web_url}/healthz", timeout=1).ok, "chaos web", 60
        )
        return self.web_url

    def worker(
        self,
        name: str,
        queues: Iterable[str],
        *,
        concurrency: int = 1,
        pool: str = "prefork",
        beat: bool = False,
        env: dict | None = None,
        wait: bool = True,
    ) -> ChildProcess:
        argv = celery_worker_argv(f"chaos-{name}", queues, concurrency, pool, beat=beat)
        child = self._start(name, argv, env)
        if wait:
            self.wait_ready(name)
        return child

    def wait_ready(self, name: str, timeout_s: float = 120) -> None:
        child = self.children[name]
        # The whole log: a worker that starts on a backlog logs a lot after " ready.".
        child.wait_until(
            lambda: " ready." in child.log_path.read_text(errors="replace"),
            f"worker {name}",
            timeout_s,
        )

    def gpu_worker(self, name: str = "gpu", services=("noop",), **kwargs) -> ChildProcess:
        from inference.dispatch.queues import service_queues

        return self.worker(name, [q for s in services for q in service_queues(s)], **kwargs)

    def control_worker(self, **kwargs) -> ChildProcess:
        from inference.dispatch.queues import control_queue

        # As shipped (scripts/processes.py CONTROL_WORKER_OPTIONS): beat and the periodic
        # tasks on 4 threads of one process.
        kwargs = {"pool": "threads", "concurrency": 4, **kwargs}
        return self.worker("control", [control_queue()], beat=True, **kwargs)

    def io_worker(self, name: str = "io", **kwargs) -> ChildProcess:
        from inference.dispatch.queues import io_queues

        return self.worker(name, io_queues(), concurrency=8, pool="threads", **kwargs)

    def kill(self, name: str) -> None:
        """SIGKILL to the whole process group: no warm shutdown, nothing handed back but what
        RabbitMQ redelivers when the connections drop."""
        child = self.children.pop(name)
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.proc.wait()
        child.stop()

    def stop(self, name: str) -> None:
        child = self.children.pop(name, None)
        if child is not None:
            child.stop(grace_s=15)

    def stop_all(self) -> None:
        for name in list(self.children):
            self.stop(name)


# --- clients ---------------------------------------------------------------------------------


@dataclass
class Submission:
    at: float  # time.monotonic() when sent
    status: int  # HTTP status; 0 = no answer (connection error or timeout)
    job_id: str | None = None
    retry_after: str | None = None
    error: str = ""


class Clients:
    """Real HTTP clients (a few threads, each with its own keep-alive session) submitting jobs
    over the REST API. Every request has a timeout; the whole run is bounded in time."""

    def __init__(self, base_url: str, api_key: str, threads: int = 4):
        self.base_url = base_url
        self.api_key = api_key
        self.threads = threads
        self.submissions: list[Submission] = []
        self._lock = threading.Lock()

    def _post(self, session: requests.Session, path: str, body: dict) -> Submission:
        sent = time.monotonic()
        try:
            response = session.post(
                f"{self.base_url}{path}",
                json=body,
                headers={"Authorization": f"Bearer {self.api_key}"},
                timeout=30,
            )
        except requests.RequestException as exc:
            return Submission(sent, 0, error=f"{type(exc).__name__}: {exc}"[:300])
        job_id = None
        if response.status_code in (200, 202):
            job_id = response.json()["id"]
        return Submission(
            sent,
            response.status_code,
            job_id=job_id,
            retry_after=response.headers.get("Retry-After"),
            error="" if response.ok else response.text[:300],
        )

    def run(
        self,
        bodies: list[tuple[str, dict]],
        *,
        rate_per_s: float | None = None,
        deadline_s: float = 300,
    ) -> list[Submission]:
        """POST every (path, body), `rate_per_s` in all (None: as fast as the threads go).
        Blocks until done; returns this run's submissions in order sent."""
        started = time.monotonic()
        results: list[Submission | None] = [None] * len(bodies)
        next_index = iter(range(len(bodies)))
        index_lock = threading.Lock()

        def client() -> None:
            with requests.Session() as session:
                while time.monotonic() - started < deadline_s:
                    with index_lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    if rate_per_s:
                        delay = started + i / rate_per_s - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                    path, body = bodies[i]
                    results[i] = self._post(session, path, body)

        workers = [threading.Thread(target=client, daemon=True) for _ in range(self.threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=deadline_s + 60)
        done = [r for r in results if r is not None]
        with self._lock:
            self.submissions.extend(done)
        return done

    def run_in_background(self, bodies, **kwargs) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(bodies,), kwargs=kwargs, daemon=True)
        thread.start()
        return thread

    @property
    def accepted_ids(self) -> list[str]:
        return [s.job_id for s in self.submissions if s.job_id]


def noop_job(text: str, *, sleep_ms: int = 0, priority: str = "api") -> tuple[str, dict]:
    return (
        "/api/v1/jobs",
        {"service": "noop", "priority": priority, "input": {"texts": [text], "sleep_ms": sleep_ms}},
    )


# --- the ledger --------------------------------------------------------------------------------


def wait_all_final(job_ids: list[str], bound_s: float, poll_s: float = 0.25) -> float | None:
    """Seconds until every job is final, or None when some are not within `bound_s`."""
    from inference.models import TERMINAL_STATUSES, Job

    started = time.monotonic()
    while True:
        open_jobs = Job.objects.filter(pk__in=job_ids).exclude(status__in=TERMINAL_STATUSES)
        if not open_jobs.exists():
            return time.monotonic() - started
        if time.monotonic() - started > bound_s:
            return None
        time.sleep(poll_s)


def first_completion_after(moment: datetime, tenant) -> datetime | None:
    from inference.models import Job, JobStatus

    return (
        Job.objects.filter(
            tenant=tenant, is_bulk=False, status=JobStatus.SUCCEEDED, finished_at__gt=moment
        )
        .order_by("finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )


@dataclass
class Report:
    scenario: str
    submitted: int = 0
    http: Counter = field(default_factory=Counter)
    accepted: int = 0
    completed: int = 0
    failed: int = 0
    failed_reasons: Counter = field(default_factory=Counter)
    lost: int = 0
    lost_states: Counter = field(default_factory=Counter)
    duplicated: int = 0
    retried: int = 0
    phantom: int = 0
    no_retry_after: int = 0
    server_errors: int = 0
    final_after_s: float | None = None
    extra: dict = field(default_factory=dict)
    suite: str = "chaos"  # the line's label: the multi-host suite reports as "cluster"

    def line(self) -> str:
        reasons = "; ".join(f"{n}× {r}" for r, n in self.failed_reasons.most_common(5))
        extra = " ".join(f"{k}={v}" for k, v in self.extra.items())
        final = (
            f"{self.final_after_s:.1f} s" if self.final_after_s is not None else "NOT within bound"
        )
        http = dict(sorted(self.http.items()))
        return (
            f"[{self.suite}] {self.scenario}: submitted={self.submitted} http={http} "
            f"accepted={self.accepted} completed={self.completed} failed={self.failed}"
            f"{f' ({reasons})' if reasons else ''} lost={self.lost}"
            f"{f' {dict(self.lost_states)}' if self.lost else ''} duplicated={self.duplicated} "
            f"retried(attempts>1)={self.retried} phantom={self.phantom} "
            f"5xx-not-503={self.server_errors} 503-without-Retry-After={self.no_retry_after} "
            f"all-final-after={final} {extra}"
        )

    def assert_ok(self) -> None:
        assert self.lost == 0, self.line()
        assert self.duplicated == 0, self.line()
        assert self.server_errors == 0, self.line()
        assert self.no_retry_after == 0, self.line()
        assert self.final_after_s is not None, self.line()


def ledger(
    scenario: str,
    tenant,
    submissions: list[Submission],
    *,
    bound_s: float,
    started_at: float | None = None,
    expected_ids: Iterable[str] = (),
) -> Report:
    """Waits (at most `bound_s`) for every accepted job to be final, then counts.

    lost: accepted (HTTP 200/202, or `expected_ids`) — or stored though refused (phantom) — yet
    not final within the bound, or missing.
    duplicated: a job whose outcome was stored more than once (more than one "completed" audit
    row), or a succeeded job without exactly one.
    retried: attempts > 1 — a run that did not finish (its worker was killed, its message
    came back) before the one that did; reported, not a duplicate.
    phantom: a job in the database for the tenant that no client was told was accepted.
    """
    from django.db.models import Count

    from inference.models import TERMINAL_STATUSES, AuditEvent, Job, JobStatus

    report = Report(scenario)
    report.submitted = len(submissions)
    report.http = Counter(s.status for s in submissions)
    report.server_errors = sum(1 for s in submissions if s.status >= 500 and s.status != 503)
    report.no_retry_after = sum(1 for s in submissions if s.status == 503 and not s.retry_after)
    accepted = list(dict.fromkeys([s.job_id for s in submissions if s.job_id] + list(expected_ids)))
    report.accepted = len(accepted)
    known = set(accepted)
    # Jobs the API stored but answered with an error (e.g. the database went away between
    # COMMIT and its acknowledgement): nobody was promised them, yet none may be stranded.
    phantoms = [
        str(pk)
        for pk in Job.objects.filter(tenant=tenant, parent__isnull=True).values_list(
            "pk", flat=True
        )
        if str(pk) not in known
    ]
    report.phantom = len(phantoms)
    waited = wait_all_final(accepted + phantoms, bound_s)
    if waited is not None:
        report.final_after_s = time.monotonic() - started_at if started_at else waited

    jobs = {str(j.pk): j for j in Job.objects.filter(pk__in=accepted + phantoms)}
    for job_id in accepted + phantoms:
        job = jobs.get(job_id)
        if job is None:
            report.lost += 1
            report.lost_states["missing"] += 1
        elif job.status not in TERMINAL_STATUSES:
            report.lost += 1
            report.lost_states[job.status] += 1
        elif job.status == JobStatus.SUCCEEDED:
            report.completed += 1
        else:
            report.failed += 1
            report.failed_reasons[f"{job.status}: {job.error[:80]}"] += 1
    # Leaf jobs (bulk pieces included) run on workers; a bulk parent is assembled, not run.
    leaves = Job.objects.filter(tenant=tenant, is_bulk=False)
    completions = dict(
        AuditEvent.objects.filter(job_id__in=leaves.values("pk"), kind="completed")
        .values("job_id")
        .annotate(n=Count("id"))
        .values_list("job_id", "n")
    )
    for job_id, status in leaves.values_list("pk", "status"):
        n = completions.get(job_id, 0)
        if n > 1 or (status == JobStatus.SUCCEEDED and n != 1):
            report.duplicated += 1
    report.retried = leaves.filter(attempts__gt=1).count()
    last = (
        Job.objects.filter(pk__in=accepted + phantoms, finished_at__isnull=False)
        .order_by("-finished_at")
        .first()
    )
    if last is not None:
        # The last job to finish, step by step (seconds after it was created): where a slow
        # recovery comes from.
        def after(moment) -> str:
            return f"{(moment - last.created_at).total_seconds():.1f}" if moment else "-"

        report.extra["last_job"] = (
            f"{last.pk}:published+{after(last.published_at)}/claimed+{after(last.claimed_at)}"
            f"/finished+{after(last.finished_at)}/attempts={last.attempts}"
        )
    return report


def wait_for(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return False
