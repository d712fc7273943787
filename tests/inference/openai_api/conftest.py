"""The official `openai` client against the front door (the web process, workers and tenant
come from tests/inference/conftest.py). It is named `client` as the tests read best, which
shadows pytest-django's Django test client: so it stays out of tests/inference/conftest.py,
where tests/inference/api uses that one, and the Batch API's conftest imports it."""

from __future__ import annotations

import pytest


@pytest.fixture
def client(front_door_url, tenant_key, services):
    """The official SDK, as users configure it; no retries, so errors are seen as sent."""
    from openai import OpenAI

    return OpenAI(base_url=f"{front_door_url}/v1", api_key=tenant_key, max_retries=0, timeout=60)
