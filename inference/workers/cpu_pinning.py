"""Pinning the model to dedicated cores on a CPU worker (RENQ_MODEL_CPUS).

On a CPU-only machine the forward pass competes for cores with everything else the host runs:
the worker's own loop, the web server, PostgreSQL, RabbitMQ. The kernel's scheduler shares
cores fairly, so the model thread is preempted whenever the rest of the stack is busy, and the
whole queue slows with it. Giving the model its own cores, as a GPU worker has its own device
(and as CPU serving stacks do with taskset/numactl), keeps it at the raw model's speed; the
rest of the worker stays off those cores.
"""

from __future__ import annotations

import logging
import os

from django.conf import settings

logger = logging.getLogger(__name__)


def parse_cpu_list(spec: str) -> frozenset[int]:
    """'0', '0-3' or '0,2,4-5' (the kernel's cpulist format) → the CPU numbers; '' → none.

    Raises ValueError naming the part it cannot read."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"RENQ_MODEL_CPUS: {part!r} is not a CPU number or range") from None
        if first < 0 or last < first:
            raise ValueError(f"RENQ_MODEL_CPUS: {part!r} is not a CPU number or range")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def model_cpus() -> frozenset[int]:
    """The cores RENQ_MODEL_CPUS gives the model (none: no pinning)."""
    return parse_cpu_list(settings.RENQ_MODEL_CPUS)


def keep_off_model_cores() -> None:
    """Bind the calling thread, and the threads it starts from now on, to the cores the model
    does not have (all of them when the model would take every one, so the worker's loop is
    never starved). Called as a worker process starts, before its threads are started."""
    cpus = model_cpus()
    if cpus:
        available = frozenset(os.sched_getaffinity(0))
        os.sched_setaffinity(0, (available - cpus) or available)  # 0: the calling thread


def pin_model_thread() -> None:
    """Bind the calling thread (the one that runs forward passes) and the threads it starts,
    torch's own included, to the model's cores. A core the process may not use fails here,
    at the first batch, with the kernel's error."""
    cpus = model_cpus()
    if cpus:
        os.sched_setaffinity(0, cpus)
        logger.info("forward passes pinned to CPUs %s", sorted(cpus))
