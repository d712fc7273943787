"""The Batch API is used through the OpenAI front door's client (tests/inference/openai_api)."""

from tests.inference.openai_api.conftest import client  # noqa: F401 (the fixture)
