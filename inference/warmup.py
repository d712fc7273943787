"""Warm pool: each worker process loads the models of the services it consumes, once, and
runs one tiny forward pass so the first real job does not pay for lazy kernel set-up."""

from __future__ import annotations

import logging
import os

import torch
from django.conf import settings

from inference.engines import load_engine
from inference.models import Service
from inference.tiers import Tier, service_queue_names
from renq_site.celery import app

logger = logging.getLogger(__name__)

WARMUP_PAYLOADS: dict[str, dict] = {
    "embedding": {"texts": ["warm up"]},
    "reranker": {"query": "warm", "documents": ["up"]},
    "llm": {"prompt": "warm up", "max_tokens": 1, "temperature": 0.0},
}


def consumed_service_names() -> set[str]:
    """Services whose tier queues this worker was started on (celery worker -Q ...)."""
    consumed = set(app.amqp.queues.consume_from or {})
    prefix = settings.RENQ_QUEUE_PREFIX
    candidates = {
        name[len(prefix) :].rsplit(".", 1)[0]
        for name in consumed
        if name.startswith(prefix) and name.rsplit(".", 1)[-1] in Tier.values
    }
    return {name for name in candidates if set(service_queue_names(name)) & consumed}


def warm_engines_for_consumed_queues() -> None:
    threads = int(os.environ.get("RENQ_TORCH_THREADS", "0")) or os.cpu_count() or 1
    torch.set_num_threads(threads)
    for service in Service.objects.filter(name__in=consumed_service_names(), active=True):
        logger.info("loading %s model %s", service.kind, service.model_ref)
        try:
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
            engine.run_batch([WARMUP_PAYLOADS[service.kind]])
        except Exception:  # a broken model must not stop the worker serving other services
            logger.exception("could not warm %s; its jobs will fail over", service.name)
