"""ASGI entry point: `gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker`.

/v1/ (the OpenAI-compatible front door, async views that wait for jobs) goes to its own
handler with no middleware and no per-request thread; everything else (the REST API, admin,
docs, probes) to Django's usual handler, where sync views run on a thread each as under WSGI.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
django_application = get_asgi_application()  # sets Django up before the front door's import

from inference.openai_api.asgi import FrontDoorHandler  # noqa: E402

FRONT_DOOR_PREFIX = "/v1/"
front_door = FrontDoorHandler()


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith(FRONT_DOOR_PREFIX):
        await front_door(scope, receive, send)
    else:
        await django_application(scope, receive, send)
