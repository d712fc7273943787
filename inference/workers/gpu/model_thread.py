"""The forward pass, on the one thread that runs the model (torch releases the GIL, so the
loop's thread forms the next batch meanwhile)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from django.utils import timezone

from inference.delivery.streaming import TextRelay
from inference.engines.protocol import RESUME
from inference.jobs.transitions import Outcome
from inference.metrics.log_fields import job_fields
from inference.models import Job
from inference.workers.cpu_pinning import pin_model_thread
from inference.workers.gpu.held import engine_payload

logger = logging.getLogger(__name__)


class ModelThread(ThreadPoolExecutor):
    """Runs forward passes one at a time, on the model's cores (RENQ_MODEL_CPUS)."""

    def __init__(self):
        super().__init__(max_workers=1, thread_name_prefix="forward", initializer=pin_model_thread)

    def infer(self, engine, jobs: list[Job], tokens: list[int], plans=None) -> Future:
        """A forward pass of the jobs (see forward_pass); its outcomes come in the future."""
        return self.submit(forward_pass, engine, jobs, tokens, plans)


def forward_pass(
    engine, jobs: list[Job], tokens: list[int], plans: list[tuple] | None = None
) -> list[Outcome]:
    """Run the jobs together (in the model thread); one outcome per job, in order.

    `plans`, per job: (decode steps this pass may take or None, the Resume of a generation
    that continues or None, the range of its texts this pass runs or None). A generation the
    pass leaves unfinished has the engine's state as its result, under RESUME."""
    started_at = timezone.now()
    started = time.perf_counter()
    payloads = [engine_payload(job) for job in jobs]
    resumed = {i: resume for i, (_, resume, _) in enumerate(plans or []) if resume is not None}
    for i, resume in resumed.items():
        payloads[i] = {**payloads[i], RESUME: resume.state}
    for i, (_, _, part) in enumerate(plans or []):
        if part is not None:
            payloads[i] = {**payloads[i], "texts": payloads[i]["texts"][part[0] : part[1]]}
    kwargs = {}
    if plans is not None and getattr(engine, "resumable", False):
        kwargs["max_steps"] = [steps for steps, _, _ in plans]
    relay = None
    if any(payload.get("stream") for payload in payloads):
        # Generated text goes out as it is produced (inference.delivery.streaming).
        relay = TextRelay(
            {i: job.pk for i, job in enumerate(jobs)},
            sequence={i: r.stream_seq for i, r in resumed.items()},
            first_text_at={i: r.first_text_at for i, r in resumed.items() if r.first_text_at},
        )
        kwargs["on_text"] = relay
    try:
        results = engine.run_batch(payloads, **kwargs)
    except Exception as exc:
        if len(jobs) == 1:
            logger.exception("job %s failed", jobs[0].pk, extra=job_fields(jobs[0]))
            # Alone, it still fails: its input is the cause. A verdict, not a crash.
            return [
                Outcome(
                    job=jobs[0],
                    error=f"{type(exc).__name__}: {exc}",
                    started_at=started_at,
                    dead_letter=True,
                )
            ]
        # One bad input must not fail its neighbours: run each alone to find it.
        logger.exception("batch of %d failed; isolating", len(jobs), extra=job_fields(jobs[0]))
        return [
            outcome
            for i, (job, n) in enumerate(zip(jobs, tokens, strict=True))
            for outcome in forward_pass(engine, [job], [n], plans and [plans[i]])
        ]
    elapsed_ms = (time.perf_counter() - started) * 1000
    if relay is not None:
        for index, first_at in relay.first_text_at.items():
            if RESUME in results[index]:
                # Where its stream goes on in the next pass.
                results[index] = {
                    **results[index],
                    "stream_seq": relay.sequence.get(index, 0),
                    "first_text_at": first_at,
                }
                continue
            # Time to first token, from submission: queue wait plus prefill plus one step.
            ttft_ms = (first_at - jobs[index].created_at.timestamp()) * 1000
            results[index] = {**results[index], "first_token_ms": round(ttft_ms, 3)}
    return [
        Outcome(
            job=job,
            result=result,
            started_at=started_at,
            inference_ms=elapsed_ms,
            batch_size=len(jobs),
            tokens=n,
        )
        for job, result, n in zip(jobs, results, tokens, strict=True)
    ]
