"""ASGI entry point: `gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker`.

/v1/ (the OpenAI-compatible front door, async views that wait for jobs) goes to its own
handler with no middleware and no per-request thread; everything else (the REST API, admin,
docs, probes) to Django's handler on a few long-lived request threads per process
(renq_site.request_lanes), which keep their PostgreSQL connections between requests.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
django.setup(set_prefix=False)  # before the handlers' imports load models

import renq_site.urls  # noqa: E402, F401  (the views load now, not on the first request)
from inference.openai_api.asgi import FrontDoorHandler  # noqa: E402
from renq_site.garbage_collection import freeze_startup_objects  # noqa: E402
from renq_site.request_lanes import LanedASGIHandler  # noqa: E402

# Connections stay open (CONN_MAX_AGE) on a bounded set of threads per process: the lanes
# here and the front door's database threads (inference/openai_api/db.py).
django_application = LanedASGIHandler()

FRONT_DOOR_PREFIX = "/v1/"
front_door = FrontDoorHandler()

# Last: what the process loaded to serve lives as long as it does.
freeze_startup_objects()


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith(FRONT_DOOR_PREFIX):
        await front_door(scope, receive, send)
    else:
        await django_application(scope, receive, send)
