from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from inference.metrics import metrics_view
from renq_site import health

urlpatterns = [
    # Probes: no auth, no trailing slash (what load balancers and orchestrators expect).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Prometheus scrapes this (no auth, like the probes: keep it off the public listener).
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("inference.api.urls")),
    # The OpenAI-compatible front door (async views; renq_site.asgi serves them thread-free).
    path("v1/", include("inference.openai_api.urls")),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[AllowAny]),
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
