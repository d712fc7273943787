import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")

from renq_site import tracing  # noqa: E402

tracing.configure()  # before the handler loads its middleware (Django's tracing is one)
application = get_wsgi_application()
