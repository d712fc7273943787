"""Pages of every list endpoint: limit/offset, with a maximum page size and strict parsing
(a malformed `limit` or `offset` is a 400 naming it, not silently the first page)."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

from inference.jobs.inputs import InputError

MAX_PAGE_SIZE = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = MAX_PAGE_SIZE

    def _strict_int(self, request, name: str, default: int, *, minimum: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise InputError(name, f"must be an integer, not {raw[:40]!r}.") from None
        if value < minimum:
            raise InputError(name, f"must be at least {minimum}.")
        return value

    def get_limit(self, request) -> int:
        limit = self._strict_int(request, self.limit_query_param, self.default_limit, minimum=1)
        if limit > self.max_limit:
            raise InputError(self.limit_query_param, f"must be at most {self.max_limit}.")
        return limit

    def get_offset(self, request) -> int:
        return self._strict_int(request, self.offset_query_param, 0, minimum=0)

    def get_schema_operation_parameters(self, view):
        """limit and offset with the bounds enforced above, so the schema admits no page size
        the API refuses."""
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters
