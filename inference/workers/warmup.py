"""Warm pool: each worker process loads the models of the services it consumes, once, and
runs one tiny forward pass so the first real job does not pay for lazy kernel set-up."""

from __future__ import annotations

import logging
import os
import time

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connections

from inference.dispatch.queues import served_service_names, tier_queue
from inference.engines import load_engine
from inference.jobs.kinds import kind_of
from inference.jobs.tiers import Tier
from inference.models import Service
from inference.scheduling.cost_model import BatchCostModel
from inference.scheduling.embedding_dims import note_embedding_dim
from renq_site.celery import app

logger = logging.getLogger(__name__)


def consumed_service_names() -> set[str]:
    """Services whose tier queues this worker was started on (celery worker -Q ...)."""
    return served_service_names(set(app.amqp.queues.consume_from or {}))


def consumed_realtime_queues() -> list[str]:
    """The realtime tier queues of the services this worker consumes (head starts)."""
    consumed = set(app.amqp.queues.consume_from or {})
    queues = (tier_queue(name, Tier.REALTIME) for name in served_service_names(consumed))
    return sorted(queue for queue in queues if queue in consumed)


def torch_threads() -> int:
    """The threads a forward pass on the CPU uses (RENQ_TORCH_THREADS; unset or 0: every core)."""
    return int(os.environ.get("RENQ_TORCH_THREADS", "0")) or os.cpu_count() or 1


def _consumed_services() -> list[Service]:
    return list(Service.objects.filter(name__in=consumed_service_names(), active=True))


def import_consumed_engines() -> None:
    """In a prefork worker's parent, before its pool starts: import the engines of the services
    it consumes (torch, transformers), so a pool process started again after a crash inherits
    them instead of importing them anew before it can load its model. A worker that runs no
    model imports neither."""
    try:
        kinds = {service.kind for service in _consumed_services()}
    except (DatabaseError, InterfaceError):
        logger.warning("could not read the consumed services; pool processes import engines")
        return
    finally:
        # The pool processes fork from here: none may share this process's session.
        connections.close_all()
    for kind in kinds:
        kind_of(kind).engine_class()


def warm_engines_for_consumed_queues() -> list[str]:
    """Load and warm the model of every service the worker consumes; the services whose
    model did not load (their jobs fail over)."""
    services = _consumed_services()
    if any(kind_of(service.kind).engine_class().uses_torch for service in services):
        import torch

        torch.set_num_threads(torch_threads())
    failed: list[str] = []
    for service in services:
        logger.info("loading %s model %s", service.kind, service.model_ref)
        try:
            # RENQ_DEVICE, when set, wins over the model's configured device.
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
            logger.info("loaded %r", engine)  # where and in what dtype, as configured
            warm = engine.run_batch([kind_of(service.kind).warmup_payload])  # lazy kernel set-up
            if "dim" in warm[0]:
                # Front doors refuse a larger `dimensions` before its job runs.
                note_embedding_dim(service.model_ref, int(warm[0]["dim"]))
            # Timed again, warm: a tiny batch is nearly all per-batch overhead, which seeds
            # the cost model that bounds batch run times (inference.scheduling.cost_model).
            started = time.perf_counter()
            engine.run_batch([kind_of(service.kind).warmup_payload])
            BatchCostModel(service.name, engine.device).observe_overhead(
                time.perf_counter() - started
            )
        except Exception:  # a broken model must not stop the worker serving other services
            logger.exception("could not warm %s; its jobs will fail over", service.name)
            failed.append(service.name)
    return failed
