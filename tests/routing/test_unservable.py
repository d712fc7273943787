"""What no backend can serve is known before the job is stored: the router's static checks on
real Postgres and Redis (the context window per input, the local model's truncation, a key
variable unset), and a keyless backend is never the last resort."""

from __future__ import annotations

import pytest

from routing.router import NoBackendCanServe, Router
from tests.routing.test_router import a_job

pytestmark = pytest.mark.django_db

UNSET_KEY = "RENQ_TEST_UNSET_KEY"
# About 750 estimated tokens: more than a small context, more than MiniLM reads (256).
LONG_TEXT = "word " * 600


@pytest.fixture(autouse=True)
def _key_unset(monkeypatch):
    monkeypatch.delenv(UNSET_KEY, raising=False)


def test_a_batch_of_long_texts_fits_a_context_that_holds_each_one(
    make_service, make_tenant, make_backend, make_route
):
    # 128 such texts are ~96,000 tokens in all, but each input is embedded on its own: the
    # context window is per input, as OpenAI's embeddings API counts it.
    service = make_service("embedding")
    tenant, _ = make_tenant()
    cloud = make_backend("cloud", max_context_tokens=1000)
    make_route(service, (cloud, 0))
    decision = Router().choose(a_job(service, tenant, texts=[LONG_TEXT] * 128))
    assert decision.backend == cloud


def test_the_local_model_truncates_so_long_texts_stay_local(
    make_service, make_tenant, make_backend, make_route, gpu_consumer
):
    service = make_service("embedding", name="trunc")
    gpu_consumer.attach("trunc")
    tenant, _ = make_tenant()
    # A local context smaller than the text: MiniLM reads 256 tokens of it, which fit.
    local = make_backend("local-trunc", kind="local", max_context_tokens=300)
    small_cloud = make_backend("small-cloud", max_context_tokens=300)
    make_route(service, (small_cloud, 0), (local, 1))
    job = a_job(service, tenant, texts=[LONG_TEXT] * 128)
    assert job.local_truncation_tokens == 256
    assert job.input_tokens == 128 * 256
    router = Router()
    assert router.serving_backend_ids(job) == {local.pk}
    decision = router.choose(job)
    assert decision.backend == local
    assert decision.reason.startswith("local: predicted wait")


def test_too_large_for_every_backend_raises_naming_each_limit(
    make_service, make_tenant, make_backend, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    small = make_backend("small", max_context_tokens=100)
    smaller = make_backend("smaller", max_context_tokens=50)
    make_route(service, (small, 0), (smaller, 1))
    with pytest.raises(NoBackendCanServe) as caught:
        Router().choose(a_job(service, tenant, texts=["short", LONG_TEXT]))
    assert caught.value.too_large
    assert caught.value.reasons == [
        "small: this job's longest input (~750 tokens) exceeds its max_context_tokens 100",
        "smaller: this job's longest input (~750 tokens) exceeds its max_context_tokens 50",
    ]


def test_every_capable_backend_keyless_raises_naming_the_variable(
    make_service, make_tenant, make_backend, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    keyless = make_backend("keyless", api_key_env=UNSET_KEY)
    llm_only = make_backend("llm-only", service_kinds=["llm"])
    make_route(service, (keyless, 0), (llm_only, 1))
    with pytest.raises(NoBackendCanServe) as caught:
        Router().choose(a_job(service, tenant))
    assert not caught.value.too_large
    assert caught.value.reasons == [
        f"keyless: misconfigured: environment variable {UNSET_KEY} is not set",
        "llm-only: does not serve embedding jobs",
    ]


def test_a_keyless_backend_is_no_last_resort(make_service, make_tenant, make_backend, make_route):
    # Nothing is healthy (no GPU worker, the keyed cloud's breaker open): the job goes to the
    # first backend that could serve it once healthy, never to the one that cannot log in.
    service = make_service("embedding", name="noworker")
    tenant, _ = make_tenant()
    keyless = make_backend("keyless", api_key_env=UNSET_KEY)
    local = make_backend("local-noworker", kind="local")
    make_route(service, (keyless, 0), (local, 1))
    decision = Router().choose(a_job(service, tenant))
    assert decision.backend == local
    assert f"keyless: misconfigured: environment variable {UNSET_KEY} is not set" in (
        decision.reason
    )


def test_the_cascade_skips_a_keyless_backend(make_service, make_tenant, make_backend, make_route):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    first = make_backend("first")
    keyless = make_backend("keyless", api_key_env=UNSET_KEY)
    make_route(service, (first, 0), (keyless, 1))
    request = a_job(service, tenant)
    assert Router().choose(request).backend == first
    decision, skipped = Router().fallback_after(request, first, tried={first.pk})
    assert decision is None
    assert skipped == [
        f"keyless: skipped (misconfigured: environment variable {UNSET_KEY} is not set)"
    ]
