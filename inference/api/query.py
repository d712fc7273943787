"""Query parameters: each view names the ones it reads, and any other is a 400 naming it, as
an unknown body field is (inference.api.intake): a typo such as `?stauts=queued` must not
answer as if nothing were filtered, nor `?wiat=5` as if nothing were waited for."""

from __future__ import annotations

from rest_framework.settings import api_settings

from inference.jobs.inputs import InputError


class NamedQueryParameters:
    """A DRF view's mixin: `query_parameters` maps an HTTP method to the names it reads."""

    query_parameters: dict[str, frozenset[str]] = {}

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)  # authenticated first: a 401 before a 400
        if not hasattr(self, request.method.lower()):
            return  # a method the view does not answer is DRF's 405, whatever it was asked
        method = "GET" if request.method == "HEAD" else request.method
        known = self.query_parameters.get(method, frozenset())
        # DRF's own ?format= chooses the renderer: whatever a view reads, it is understood.
        unknown = sorted(set(request.query_params) - known - {api_settings.URL_FORMAT_OVERRIDE})
        if unknown:
            listed = f"known: {', '.join(sorted(known))}" if known else "it takes none"
            raise InputError(unknown[0], f"is not a query parameter of {method} here ({listed}).")
