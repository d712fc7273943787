"""How fast the local workers get through a service's jobs, measured from real batches.

A moving average of jobs/s per local worker process (`record_local_batch`, shared in Redis by
every worker), times the service's worker count. Before any measurement, a prior from the
service's own settings. The job lifecycle counts the jobs ahead and turns this into a
`LocalWait` for the router.
"""

from __future__ import annotations

from routing.stats import SampleBuffer, read_ewma, throughput_key

# Prior of one batch's duration beyond batch_timeout, until a real measurement exists.
PRIOR_BATCH_RUN_S = 0.1
# A worker's batches reach the shared average at most this often (one round trip each time):
# routing and scaling read it as a rate, not per batch.
SEND_INTERVAL_S = 1.0
_batches = SampleBuffer(SEND_INTERVAL_S)


def record_local_batch(service_name: str, jobs: int, seconds: float) -> None:
    """One worker ran `jobs` in `seconds` of inference: update the service's throughput (within
    SEND_INTERVAL_S). Raises what Redis raises."""
    if jobs > 0 and seconds > 0:
        _batches.add(throughput_key(service_name), jobs / seconds)


def local_throughput(
    service_name: str, *, batch_size: int, batch_timeout_s: float, worker_count: int
) -> tuple[float, bool]:
    """(jobs per second over all local workers of the service, whether measured)."""
    per_worker = read_ewma(throughput_key(service_name))
    measured = per_worker is not None
    if per_worker is None:
        per_worker = batch_size / (batch_timeout_s + PRIOR_BATCH_RUN_S)
    return per_worker * max(worker_count, 1), measured
