"""ASGI entry point: `gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker`.

/v1/ (the OpenAI-compatible front door, async views that wait for jobs) goes to its own
handler with no middleware and no per-request thread; everything else (the REST API, admin,
docs, probes) to Django's usual handler, where sync views run on a thread each as under WSGI.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
# Under ASGI a sync view's request may run on any thread of a pool, so a connection kept for
# reuse is kept per thread and they pile up (73 seen at once, then PostgreSQL's limit of 100
# refused requests): the web closes its connections after each request, as Django advises.
os.environ.setdefault("RENQ_DB_CONN_MAX_AGE", "0")
django_application = get_asgi_application()  # sets Django up before the front door's import

from inference.openai_api.asgi import FrontDoorHandler  # noqa: E402

FRONT_DOOR_PREFIX = "/v1/"
front_door = FrontDoorHandler()


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith(FRONT_DOOR_PREFIX):
        await front_door(scope, receive, send)
    else:
        await django_application(scope, receive, send)
