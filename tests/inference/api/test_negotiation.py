"""What a response is rendered as: JSON for API clients, the browsable API for a browser,
exactly as DRF negotiates it (renq only skips parsing the Accept headers clients send)."""

from __future__ import annotations

import pytest
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from inference.api.negotiation import PlainAcceptNegotiation

pytestmark = pytest.mark.django_db

ACCEPTS = ["", "*/*", "application/json", "text/html", "application/json; indent=4", "text/csv"]


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_api_answers_each_accept_header_as_drf_would(api, make_service, accept):
    make_service("embedding")
    headers = {"HTTP_ACCEPT": accept} if accept else {}
    response = api.get("/api/v1/jobs", **headers)
    expected = {
        "": (200, "application/json"),
        "*/*": (200, "application/json"),
        "application/json": (200, "application/json"),
        "text/html": (200, "text/html; charset=utf-8"),  # the browsable API
        "application/json; indent=4": (200, "application/json"),
        "text/csv": (406, "application/json"),
    }[accept]
    assert (response.status_code, response["Content-Type"]) == expected


@pytest.mark.parametrize("query", ["", "?format=json", "?format=api"])
@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize(
    "renderers",
    [[JSONRenderer, BrowsableAPIRenderer], [BrowsableAPIRenderer, JSONRenderer], [JSONRenderer]],
    ids=["json-first", "browsable-first", "json-only"],
)
def test_the_choice_is_drfs_for_every_header_override_and_renderer_order(
    accept, query, renderers
):
    factory = APIRequestFactory()
    raw = factory.get("/api/v1/jobs" + query, **({"HTTP_ACCEPT": accept} if accept else {}))
    raw.META.pop("HTTP_ACCEPT", None) if not accept else None
    instances = [renderer() for renderer in renderers]

    def choice(negotiation) -> tuple:
        try:
            renderer, media_type = negotiation.select_renderer(Request(raw), instances)
        except Exception as exc:  # noqa: BLE001 - a 406 must be a 406 in both
            return ("raised", type(exc).__name__)
        return (type(renderer).__name__, media_type)

    assert choice(PlainAcceptNegotiation()) == choice(DefaultContentNegotiation())
