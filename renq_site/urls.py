from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from inference.admin import queues_view, service_queue_view
from inference.api.schema import SchemaView
from inference.batch_api import urls as batch_api_urls
from inference.metrics.collector import metrics_view
from inference.openai_api import urls as openai_api_urls
from renq_site import health

urlpatterns = [
    # Probes: no auth, no trailing slash (what load balancers and orchestrators expect).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Prometheus scrapes this (no auth, like the probes: keep it off the public listener).
    path("metrics", metrics_view, name="metrics"),
    # The queue pages: staff only (admin_view), ahead of the admin's own catch-all.
    path("admin/queues/", admin.site.admin_view(queues_view), name="admin-queues"),
    path(
        "admin/queues/<slug:service>/",
        admin.site.admin_view(service_queue_view),
        name="admin-service-queue",
    ),
    path("admin/", admin.site.urls),
    path("api/v1/", include("inference.api.urls")),
    # The OpenAI-compatible front door (async views; renq_site.asgi serves them thread-free)
    # and the Batch API built on it, joined here in the front door's one namespace.
    path(
        "v1/",
        include(
            (
                openai_api_urls.urlpatterns + batch_api_urls.urlpatterns,
                openai_api_urls.app_name,
            )
        ),
    ),
    # Cohere v2's /v2/embed and /v2/rerank, TEI's /rerank: the front door outside /v1/.
    *openai_api_urls.root_urlpatterns,
    path(
        "api/schema/",
        SchemaView.as_view(authentication_classes=[], permission_classes=[AllowAny]),
        name="schema",
    ),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(
            url_name="schema", authentication_classes=[], permission_classes=[AllowAny]
        ),
        name="api-docs",
    ),
]


# The OpenAI-compatible front door's paths (renq_site.asgi serves them thread-free).
FRONT_DOOR_PREFIX = "/v1/"
# Paths whose clients are SDKs (OpenAI's, Cohere's v2) that read errors in OpenAI's JSON
# shape, not a page.
SDK_PREFIXES = (FRONT_DOOR_PREFIX, "/v2/")


def not_found(request, exception=None):
    """The REST API's 404 in its JSON error shape (a malformed job id never matches the URL
    pattern, and Django's own 404 is an HTML page), the front door's in OpenAI's (as OpenAI
    answers a path it does not serve); every other path keeps Django's page."""
    if request.path.startswith(SDK_PREFIXES):
        from inference.openai_api.errors import OpenAIError

        return OpenAIError(
            404,
            f"Invalid URL ({request.method} {request.path}): no such endpoint here; "
            "GET /v1/models lists the models.",
            code="unknown_url",
        ).response()
    if request.path.startswith("/api/"):
        from django.http import JsonResponse

        from renq_site.middleware import error_body

        message = "no such resource (a job id is a UUID)."
        return JsonResponse(error_body("not_found", message, "path"), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


handler404 = not_found
