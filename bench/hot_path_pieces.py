"""CPU of single pieces of the submit and worker hot paths, in this process, against the real
RabbitMQ and the bench's database (no web server, no worker):

- a dispatch message published with a confirm: through Celery (`as_task_v2`,
  `send_task_message`, kombu's producer pool), as renq did before, and by
  `inference.dispatch.publishing.publish_task` (renq's message on a kept confirm-mode channel);
- RabbitMQ's own CPU (its process, from /proc) for a persistent and a transient publish, and
  for an empty basic.get (what a tier queue costs when it is asked and holds nothing), and the
  asking process's CPU for it;
- building and preparing 100 jobs' INSERT rows: `Job(**fields)` with the ORM's preparation,
  and the submit path's `NewJobRow` + `row_writer.insert_statement`;
- a Redis command (a Lua script's EVALSHA, as the fair-share tags and the announce send, and an
  MGET) with redis-py's Python reply parser and with hiredis's.

Each figure is the best of several rounds (the machine is shared), both ways alternating.

Usage: python bench/hot_path_pieces.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (the bench's own database, queue prefix and Redis)

SERVICE = "bench-pieces"


def _cpu_ms_per_call(fn, calls: int) -> float:
    started = time.process_time()
    for i in range(calls):
        fn(i)
    return (time.process_time() - started) / calls * 1000


def _rabbitmq_cpu_s() -> float:
    total = 0.0
    pids = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True).stdout
    for pid in pids.split():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def publishing(rounds: int, calls: int = 1_000) -> dict:
    from inference.dispatch.publishing import publish_task, task_message
    from inference.dispatch.queues import tier_queue
    from renq_site.celery import app

    queue = tier_queue(SERVICE, "api")

    def through_celery(i: int) -> None:
        message = app.amqp.as_task_v2(
            str(uuid.uuid4()), "inference.run_job", args=[f"job {i}"], ignore_result=True
        )
        with app.producer_or_acquire() as producer:
            app.amqp.send_task_message(
                producer, "inference.run_job", message, queue=queue, priority=2
            )

    def renq(i: int) -> None:
        publish_task("inference.run_job", [f"job {i}"], queue=queue, priority=2)

    best = {"celery_ms": float("inf"), "renq_ms": float("inf")}
    renq(0), through_celery(0)  # connections and declarations first
    for _ in range(rounds):
        best["celery_ms"] = min(best["celery_ms"], _cpu_ms_per_call(through_celery, calls))
        best["renq_ms"] = min(best["renq_ms"], _cpu_ms_per_call(renq, calls))
        common.purge_queues([queue])

    from inference.dispatch.publishing import _channels

    def rabbitmq_ms(delivery_mode: int) -> float:
        before = _rabbitmq_cpu_s()
        for i in range(calls):
            message = task_message("inference.run_job", [f"job {i}"], priority=2)
            message.properties["delivery_mode"] = delivery_mode
            _channels.publish(message, queue)
        return (_rabbitmq_cpu_s() - before) / calls * 1000

    persistent, transient = float("inf"), float("inf")
    empty_get, empty_get_client = float("inf"), float("inf")
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        for _ in range(rounds):
            persistent = min(persistent, rabbitmq_ms(2))
            transient = min(transient, rabbitmq_ms(1))
            common.purge_queues([queue])
            before = _rabbitmq_cpu_s()
            client_ms = _cpu_ms_per_call(lambda _: channel.basic_get(queue), calls)
            empty_get = min(empty_get, (_rabbitmq_cpu_s() - before) / calls * 1000)
            empty_get_client = min(empty_get_client, client_ms)
    return {
        **best,
        "rabbitmq_persistent_publish_ms": persistent,
        "rabbitmq_transient_publish_ms": transient,
        "rabbitmq_empty_get_ms": empty_get,
        "client_empty_get_ms": empty_get_client,
    }


def job_rows(rounds: int, posts: int = 20, per_post: int = 100) -> dict:
    from django.db import connection
    from django.utils import timezone

    from inference.intake.row_writer import insert_statement
    from inference.intake.submission import NewJobRow
    from inference.models import Job, Service

    service, _ = Service.objects.update_or_create(
        name=SERVICE, defaults={"kind": "noop", "model_ref": "none"}
    )
    tenant, _ = common.bench_tenant()
    now = timezone.now()
    fields = dict(tier="api", message_priority=2, created_at=now, published_at=now)
    rows = NewJobRow()
    concrete = Job._meta.concrete_fields

    def keyword_built(_: int) -> None:
        jobs = [
            Job(tenant=tenant, service=service, input={"texts": ["x"]}, **fields)
            for _ in range(per_post)
        ]
        for job in jobs:
            for field in concrete:
                field.get_db_prep_save(field.pre_save(job, True), connection)

    def positional(_: int) -> None:
        jobs = [
            rows.build(tenant, service, input={"texts": ["x"]}, **fields) for _ in range(per_post)
        ]
        insert_statement(jobs)

    best = {"orm_ms_per_job": float("inf"), "renq_ms_per_job": float("inf")}
    for _ in range(rounds):
        best["orm_ms_per_job"] = min(
            best["orm_ms_per_job"], _cpu_ms_per_call(keyword_built, posts) / per_post
        )
        best["renq_ms_per_job"] = min(
            best["renq_ms_per_job"], _cpu_ms_per_call(positional, posts) / per_post
        )
    return best


def _redis_command_ms(parser, calls: int) -> dict[str, float]:
    import redis
    from django.conf import settings

    pool = redis.ConnectionPool.from_url(settings.RENQ_REDIS_URL, parser_class=parser)
    client = redis.Redis(connection_pool=pool)
    script = client.register_script("return {KEYS[1], ARGV[1], 3, 4}")
    keys = ["bench:pieces:a", "bench:pieces:b", "bench:pieces:c"]
    for i in range(50):  # the script loaded, the connection open
        script(keys=keys[:1], args=[i])
    try:
        return {
            "evalsha": _cpu_ms_per_call(lambda i: script(keys=keys[:1], args=[i]), calls),
            "mget": _cpu_ms_per_call(lambda i: client.mget(keys), calls),
        }
    finally:
        pool.disconnect()


def redis_commands(rounds: int, calls: int = 2_000) -> dict:
    from redis._parsers import _HiredisParser, _RESP3Parser

    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, parser in (("python", _RESP3Parser), ("hiredis", _HiredisParser)):
            for what, ms in _redis_command_ms(parser, calls).items():
                key = f"{what}_{name}_ms"
                best[key] = min(best.get(key, ms), ms)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import django

    django.setup()
    common.ensure_database()
    published = publishing(args.rounds)
    print(
        f"publish with confirm, CPU of this process per message: through Celery "
        f"{published['celery_ms']:.3f} ms, renq's publish_task {published['renq_ms']:.3f} ms"
    )
    print(
        f"RabbitMQ's CPU per message: persistent publish "
        f"{published['rabbitmq_persistent_publish_ms']:.3f} ms, transient "
        f"{published['rabbitmq_transient_publish_ms']:.3f} ms, empty basic.get "
        f"{published['rabbitmq_empty_get_ms']:.3f} ms (and {published['client_empty_get_ms']:.3f} "
        "ms of the asking process)"
    )
    built = job_rows(args.rounds)
    print(
        f"building and preparing 100 jobs' INSERT rows, CPU per job: Job(**fields) + the ORM's "
        f"preparation {built['orm_ms_per_job']:.4f} ms, NewJobRow + insert_statement "
        f"{built['renq_ms_per_job']:.4f} ms"
    )
    commands = redis_commands(args.rounds)
    print(
        "a Redis command, CPU of this process: EVALSHA "
        f"{commands['evalsha_python_ms']:.3f} ms with redis-py's Python parser, "
        f"{commands['evalsha_hiredis_ms']:.3f} ms with hiredis; MGET of 3 keys "
        f"{commands['mget_python_ms']:.3f} / {commands['mget_hiredis_ms']:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
