"""The answer of a waiting request (a `/v1/` response, a REST `?wait=`), encoded with orjson.

An embedding is hundreds of floats: Django's JsonResponse (the standard library's encoder)
spends many times orjson's time on them, on the web process, on the request's path.
Dates, decimals and the like are written as DjangoJSONEncoder writes them, so the body reads
as JsonResponse's would.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse

_django_default = DjangoJSONEncoder().default
# Datetimes go to DjangoJSONEncoder; int keys become strings, as json.dumps makes them.
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


class AnswerResponse(HttpResponse):
    """JsonResponse's contract (any JSON value, `application/json`), orjson's speed."""

    def __init__(self, data: Any, **kwargs: Any):
        kwargs.setdefault("content_type", "application/json")
        super().__init__(
            content=orjson.dumps(data, default=_django_default, option=_OPTIONS),
            **kwargs,
        )
