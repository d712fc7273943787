"""The head start a front door may offer an idle worker for a realtime job before submitting
it (inference.dispatch.head_start), decided on the event loop from this process's cached rows
only, never a query: the database thread's hop, authentication and admission then overlap
the forward pass. The submit still decides everything: a pass for a job that is then refused,
served at another tier or never committed is dropped (inference.workers.gpu.early_pass)."""

from __future__ import annotations

from collections.abc import Callable

from inference.dispatch.publishing import carried_text
from inference.dispatch.queues import tier_queue
from inference.intake import lookups
from inference.jobs.kinds import validate_input
from inference.jobs.tiers import Tier
from inference.models import Service
from routing.router import cached_route_entries

# The kinds whose requests get a head start from the event loop: a generation takes none (its
# model batches continuously), and building its prompt reads the model's chat template.
HEAD_START_KINDS = frozenset({"embedding", "reranker"})


def head_start_target(
    authorization: str, service_name: object, payload: Callable[[Service], object]
) -> tuple[str, str] | None:
    """The queue and the input (JSON) to offer for a realtime job of `service_name`, whose
    input `payload(service)` builds (raising when the request is not one for that service):
    None unless the key and the service are cached, the service is of a kind that takes head
    starts and has no route (one may send the job to a cloud API), and the input is valid."""
    key = lookups.bearer_key(authorization)
    api_key = lookups.cached_api_key(key) if key is not None else None
    service = lookups.cached_service(service_name) if isinstance(service_name, str) else None
    if api_key is None or api_key.expired or service is None:
        return None
    if service.kind not in HEAD_START_KINDS or cached_route_entries(service.pk) != []:
        return None
    try:
        clean = validate_input(
            service.kind, payload(service), max_items=service.max_items_per_job
        )
    except Exception:  # noqa: BLE001 - the submit answers a bad request, in its own words
        return None
    carried = carried_text(clean)
    return None if carried is None else (tier_queue(service.name, Tier.REALTIME), carried)
