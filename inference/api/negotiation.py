"""Content negotiation without parsing the Accept header that API clients send.

Clients of the REST API send no Accept header, `*/*` (requests, curl, httpx) or
`application/json`; for those DRF's negotiation would parse media types and their precedence on
every request, for the same answer each time. Those three are answered here as DRF would
answer them; anything else (a browser asking for text/html: the browsable API) and a `?format=`
override are negotiated by DRF itself.
"""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation

ANY = ("", "*/*")
JSON = "application/json"


class PlainAcceptNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        return self._plain_choice(request, renderers, format_suffix) or super().select_renderer(
            request, renderers, format_suffix
        )

    def _plain_choice(self, request, renderers, format_suffix) -> tuple | None:
        """DRF's answer for a plain Accept header, or None to let DRF negotiate."""
        accept = request.META.get("HTTP_ACCEPT", "")
        if not renderers or format_suffix is not None or accept not in (*ANY, JSON):
            return None
        if self.settings.URL_FORMAT_OVERRIDE in request.query_params:
            return None
        if accept in ANY:
            return renderers[0], renderers[0].media_type
        return next(((r, JSON) for r in renderers if r.media_type == JSON), None)
