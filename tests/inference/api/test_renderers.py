"""The REST API's JSON (OrjsonRenderer) reads as DRF's own renderer writes it."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid

from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer

from inference.api.renderers import OrjsonRenderer

PAGE = {
    "id": uuid.UUID("12345678-1234-4678-9234-567812345678"),
    "created_at": datetime.datetime(2026, 12, 7, 8, 0, 0, 123456, tzinfo=datetime.UTC),
    "cost": decimal.Decimal("0.125"),
    "reason": gettext_lazy("queued"),
    "result": {"embeddings": [[0.1, -2.5e-05, 3.0, 1 / 3]]},
    "text": "a\u2028b\u2029c é",
    "counts": {1: 2},
}


def test_a_page_reads_as_drfs_renderer_writes_it():
    ours, drfs = OrjsonRenderer().render(PAGE), JSONRenderer().render(PAGE)
    assert json.loads(ours) == json.loads(drfs)
    assert b"\\u2028" in ours and b"\\u2029" in ours  # kept a strict JavaScript subset
    assert b'"created_at":"2026-12-07T08:00:00.123456Z"' in ours


def test_indentation_asked_for_is_drfs():
    asked = "application/json; indent=2"
    assert OrjsonRenderer().render(PAGE, asked) == JSONRenderer().render(PAGE, asked)


def test_what_orjson_cannot_write_is_written_by_drf():
    huge = {"input": {"n": 10**30}}
    assert json.loads(OrjsonRenderer().render(huge)) == huge
