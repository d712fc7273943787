"""What drf-spectacular cannot infer about the REST API, declared for /api/schema/.

- `Authorization: Bearer <api key>` (inference.intake.auth.ApiKeyAuthentication) as a security
  scheme.
- Request bodies are closed: the views refuse unknown fields by name (a typo such as "priorty"
  must not run a job at the default tier), so the schema says `additionalProperties: false`.

The hook is listed in SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"].
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension

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
