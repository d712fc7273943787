"""Content negotiation without parsing the Accept header that API clients send.

Clients of the REST API send no Accept header, `*/*` (requests, curl, httpx) or
`application/json`; for those DRF's negotiation parsed media types and their precedence on every
request, 5 % of the web's CPU per single-job POST. Those three are answered here as DRF would
answer them; anything else (a browser asking for text/html: the browsable API) and a `?format=`
override are negotiated by DRF itself.
"""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation

ANY = ("", "*/*")
JSON = "application/json"


class PlainAcceptNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        accept = request.META.get("HTTP_ACCEPT", "")
        if renderers and format_suffix is None and (accept in ANY or accept == JSON):
            if self.settings.URL_FORMAT_OVERRIDE not in request.query_params:
                if accept in ANY:
                    return renderers[0], renderers[0].media_type
                for renderer in renderers:
                    if renderer.media_type == JSON:
                        return renderer, JSON
        return super().select_renderer(request, renderers, format_suffix)
