"""Every RabbitMQ queue renq uses: its name, its arguments, and who consumes it.

    queue                                   consumer                    carries
    <service>.realtime|api|batch|offline    the service's GPU workers   local jobs (bulk pieces
                                                                        too), by tenant
    io.realtime|api|batch|offline           I/O workers (threads)       jobs routed to a cloud API
    renq.control                            the control worker (beat)   the sweep
    renq.dead                               nobody (operators)          dead letters

Tiers are separate queues so a worker chooses which tier to serve next; inside a tier queue (a
service's or io.<tier>) the AMQP message priority is the tenant's fair-share band
(inference.dispatch.fair_share); a bulk job's pieces wait there like any job of their tier
(Issue #27). Every queue is a durable classic queue (quorum queues have no priorities on
RabbitMQ 3.x) declared with `x-max-priority = MAX_PRIORITY`; a redeclaration with other
arguments would fail with 406 PRECONDITION_FAILED, so the Celery app takes the number from
here. `RENQ_QUEUE_PREFIX` separates test and bench traffic from the demo's on one broker.
"""

from __future__ import annotations

from django.conf import settings

from inference.jobs.tiers import TIER_NAMES, TIER_ORDER, Tier

# Message priorities 0..MAX_PRIORITY: the fair share's bands, or the plan's static priority.
# Kept small (each level is a sub-queue in RabbitMQ), and fixed: queues already declared with
# another x-max-priority would refuse the redeclaration.
MAX_PRIORITY = 3
CONTROL_QUEUE = "renq.control"
DEAD_LETTER_QUEUE = "renq.dead"
IO_QUEUE_PREFIX = "io"


def _prefixed(name: str) -> str:
    return f"{settings.RENQ_QUEUE_PREFIX}{name}"


def tier_queue(service_name: str, tier: str) -> str:
    return _prefixed(f"{service_name}.{Tier(tier).value}")


def service_tier_queues(service_name: str) -> list[str]:
    return [tier_queue(service_name, tier) for tier in TIER_ORDER]


def service_queues(service_name: str) -> list[str]:
    """Every queue a GPU worker for this service consumes (`celery worker -Q ...`): its tier
    queues."""
    return service_tier_queues(service_name)


def io_queue(tier: str) -> str:
    return _prefixed(f"{IO_QUEUE_PREFIX}.{Tier(tier).value}")


def io_queues() -> list[str]:
    return [io_queue(tier) for tier in TIER_ORDER]


def control_queue() -> str:
    return _prefixed(CONTROL_QUEUE)


def dead_letter_queue() -> str:
    """Jobs given up on (lost too often, or their input makes the model raise); nobody
    consumes it: operators read it, the admin requeues the jobs."""
    return _prefixed(DEAD_LETTER_QUEUE)


def served_service_names(queue_names: set[str]) -> set[str]:
    """Services whose tier queues are among `queue_names` (a worker's -Q list)."""
    prefix = settings.RENQ_QUEUE_PREFIX
    names = set()
    for name in queue_names:
        if not name.startswith(prefix):
            continue
        service, _, tier = name[len(prefix) :].rpartition(".")
        if service and service != IO_QUEUE_PREFIX and tier in TIER_NAMES:
            names.add(service)
    return names
