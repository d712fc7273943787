"""ASGI entry point: `gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker`.

/v1/ (the OpenAI-compatible front door, async views that wait for jobs) and the front door's
paths outside it (Cohere's /v2/ embed and rerank, TEI's /rerank) go to its own handler with no
middleware and no per-request thread; everything else (the REST API, admin, docs, probes) to
Django's handler on a few long-lived request threads per process (renq_site.request_lanes),
which keep their PostgreSQL connections between requests.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
django.setup(set_prefix=False)  # before the handlers' imports load models

from inference.api.head_start import offer_before_lane  # noqa: E402
from inference.openai_api.asgi import FrontDoorHandler  # noqa: E402
from inference.openai_api.urls import root_urlpatterns  # noqa: E402
from renq_site import tracing  # noqa: E402
from renq_site.garbage_collection import freeze_startup_objects  # noqa: E402
from renq_site.request_lanes import LanedASGIHandler  # noqa: E402
from renq_site.urls import FRONT_DOOR_PREFIX  # noqa: E402  (the views load now, not on the first request)

tracing.configure()  # before the handlers load their middleware (Django's tracing is one)

# Connections stay open (CONN_MAX_AGE) on a bounded set of threads per process: the lanes
# here and the front door's database threads (inference/openai_api/db.py).
# A realtime `POST /api/v1/jobs?wait=` offers its head start before it takes a lane.
django_application = LanedASGIHandler(before_lane=offer_before_lane)

# Cohere v2's and TEI's paths, outside /v1/ as their clients call them.
FRONT_DOOR_PATHS = frozenset(f"/{pattern.pattern}" for pattern in root_urlpatterns)
front_door = tracing.asgi_app(FrontDoorHandler())

# Last: what the process loaded to serve lives as long as it does.
freeze_startup_objects()


async def application(scope, receive, send):
    path = scope.get("path", "")  # lifespan scopes have none
    if scope["type"] == "http" and (path.startswith(FRONT_DOOR_PREFIX) or path in FRONT_DOOR_PATHS):
        await front_door(scope, receive, send)
    else:
        await django_application(scope, receive, send)
