"""The model's share of a CPU host: dedicated cores (RENQ_MODEL_CPUS) and the worker's
scheduling priority (RENQ_MODEL_NICE).

On a CPU-only machine the forward pass competes for cores with everything else the host runs:
the worker's own loop, the web server, PostgreSQL, RabbitMQ. The kernel's scheduler shares
cores fairly, so the model thread is preempted whenever the rest of the stack is busy, and the
whole queue slows with it. Giving the model its own cores, as a GPU worker has its own device
(and as CPU serving stacks do with taskset/numactl), keeps it at the raw model's speed; the
rest of the worker stays off those cores.

Without dedicated cores, the worker that runs a model can run at a higher priority than the
rest of the stack instead (RENQ_MODEL_NICE, off by default): its forward passes then wait less
for a core, and the submissions, the broker and the database wait more, realtime ones too.
Linux shares CPU first between sessions (autogroups, one per `make web`, `make worker`,
PostgreSQL, …) and only then between the threads of one, so the nice is set on the worker's
session as well as on its threads.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

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


def host_cores() -> frozenset[int]:
    """The cores this process may use, the model's included (keep_off_model_cores takes those
    out of the calling thread's)."""
    return frozenset(os.sched_getaffinity(0)) | model_cpus()


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


# The kernel's knob for the nice of the calling process's session (autogroup), where it has one.
AUTOGROUP = Path("/proc/self/autogroup")


def raise_model_priority(model_threads: int) -> None:
    """Run the calling thread, the threads it starts from now on and the worker's session at
    RENQ_MODEL_NICE (0: as started), when the model's `model_threads` leave a core to the rest
    of the host: a model on every core at that priority would starve the submissions that feed
    it. Called as a worker process that runs a model starts, before its threads are started.
    Lowering a nice below 0 needs CAP_SYS_NICE (or RLIMIT_NICE): without it the worker runs as
    started, and says so once."""
    nice = settings.RENQ_MODEL_NICE
    if not nice:
        return
    if model_threads >= len(host_cores()):
        logger.info(
            "the model's %d threads take every core: its worker keeps its priority", model_threads
        )
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # on Linux: this thread, inherited by new ones
    except PermissionError:
        logger.warning(
            "cannot run the model's worker at nice %d (needs CAP_SYS_NICE); it runs at the "
            "priority it was started with. RENQ_MODEL_NICE=0 keeps it so without this warning",
            nice,
        )
        return
    try:
        if AUTOGROUP.exists():
            AUTOGROUP.write_text(str(nice))
    except OSError as exc:  # a read-only /proc, say: the threads' nice still counts in-session
        logger.info("the worker's session keeps its nice (%s)", exc)
    logger.info("the model's worker runs at nice %d", nice)
