"""What the state machine tells the rest of renq. It changes rows and sends these; it records
no metric and wakes no waiter itself. Receivers are connected in InferenceConfig.ready():
inference.metrics.receivers counts, inference.delivery.waiting wakes the front doors."""

from __future__ import annotations

from django.dispatch import Signal

# `outcomes`: Outcome objects just stored (succeeded or failed), in the storing transaction.
outcomes_stored = Signal()

# `jobs`, `status`, `reason`: jobs in hand that reached a final status without an outcome
# (waited past their deadline when claimed).
jobs_ended = Signal()

# `queryset`, `from_status`, `status`, `reason`: sent BEFORE a filtered move (expire, cancel,
# fail), so a receiver that counts sees the rows while they are still in `from_status`.
jobs_leaving = Signal()

# `job_ids`: jobs that reached a final status, sent once their transaction committed (a
# receiver that wakes waiters must not wake them before the row is visible); `stored`: the
# Outcome objects of those that succeeded with exactly that outcome stored (may be empty).
jobs_finished = Signal()
