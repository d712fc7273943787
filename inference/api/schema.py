"""What drf-spectacular cannot infer about the REST API, declared for /api/schema/.

- `Authorization: Bearer <api key>` (inference.intake.auth.ApiKeyAuthentication) as a security
  scheme.
- Request bodies are closed: the views refuse unknown fields by name (a typo such as "priorty"
  must not run a job at the default tier), so the schema says `additionalProperties: false`.

The hook is listed in SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]. `SchemaView` serves it.
"""

from __future__ import annotations

import threading

from django.utils import translation
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.views import SpectacularAPIView
from rest_framework.response import Response

# Request components whose unknown fields the API refuses (inference.api.intake.JOB_FIELDS).
CLOSED_REQUEST_COMPONENTS = ("JobSubmit", "BulkJobSubmit")


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "inference.intake.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant's API key (`manage.py create_tenant` prints it once).",
        }


def closed_request_bodies(result, generator, request, public):
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    return result


class SchemaView(SpectacularAPIView):
    """/api/schema/, generated once per process and version, under a lock: drf-spectacular's
    generator is not thread-safe (its extensions load lazily into shared class state,
    tfranzel/drf-spectacular#1123), and the schema changes only with the code."""

    _lock = threading.Lock()
    _schemas: dict[tuple, dict] = {}

    def _get_schema_response(self, request):
        version = self.api_version or request.version or self._get_version_parameter(request)
        key = (version, translation.get_language(), self.serve_public)
        with self._lock:
            schema = self._schemas.get(key)
            if schema is None:
                generator = self.generator_class(
                    urlconf=self.urlconf, api_version=version, patterns=self.patterns
                )
                schema = generator.get_schema(request=request, public=self.serve_public)
                self._schemas[key] = schema
        filename = self._get_filename(request, version)
        return Response(schema, headers={"Content-Disposition": f'inline; filename="{filename}"'})
