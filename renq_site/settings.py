"""renq settings. Everything that differs between machines comes from the environment."""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DJANGO_DEBUG", False)
# The key signs sessions (the admin): never a default one outside DEBUG. `make setup` writes a
# per-checkout key to .run/secret_key for local runs; deployments set DJANGO_SECRET_KEY.
_LOCAL_SECRET_KEY_FILE = BASE_DIR / ".run" / "secret_key"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "").strip() or (
    _LOCAL_SECRET_KEY_FILE.read_text().strip() if _LOCAL_SECRET_KEY_FILE.is_file() else ""
)
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set (and no .run/secret_key from `make setup`): refusing "
            "to start with a default secret key while DEBUG is off."
        )
    SECRET_KEY = "renq-dev-only-not-secret"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    # Swagger UI / ReDoc assets served from our own static files: the docs page works offline.
    "drf_spectacular_sidecar",
    "inference",
    # config.yaml's model layer, tier policies and the change marker workers poll.
    "inference.config",
    # The Batch API: its own models and migrations, on the inference app's tables.
    "inference.batch_api",
    "routing",
]

MIDDLEWARE = [
    # Outermost: a too-large body is refused before anything reads it, and a dependency
    # outage anywhere below is a 503 with Retry-After, never a 500.
    "renq_site.middleware.RequestBodyLimitMiddleware",
    "renq_site.middleware.DependencyUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (admin CSS, the docs page's assets) come from the app server itself: gunicorn
    # alone serves a working admin and docs page, no nginx needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "renq_site.urls"
WSGI_APPLICATION = "renq_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/renq"),
        # Health checks instead of long-lived blind reuse: a worker must survive a Postgres
        # restart without "connection already closed" (celery#2996).
        conn_max_age=int(os.environ.get("RENQ_DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("RENQ_TEST_DATABASE", "renq_test")}
# A connect that gets no answer (a host cut off mid-handshake) fails instead of hanging the
# process forever; the request or task then answers 503 or goes back to its queue.
DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
    "connect_timeout", int(os.environ.get("RENQ_DB_CONNECT_TIMEOUT_S", "10"))
)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# WhiteNoise also finds files in the apps' static folders (and prefers them to STATIC_ROOT), so
# a missing or stale collectstatic never breaks the admin or the docs page. Not the Manifest
# storage: it fails every page that uses a static file until collectstatic has run.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["inference.intake.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "inference.api.negotiation.PlainAcceptNegotiation",
    "DEFAULT_RENDERER_CLASSES": [
        "inference.api.renderers.OrjsonRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "inference.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "inference.api.errors.renq_exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "renq API",
    "DESCRIPTION": "Submit inference jobs to renq's priority queues and read their results.",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Bearer API keys as a security scheme; request bodies closed (unknown fields are a 400).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "inference.api.schema.closed_request_bodies",
    ],
}

# --- Celery / RabbitMQ -------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
# Redis counts chord members natively (no chord_unlock polling, unlike rpc:// or the DB backend).
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/0")
# Queue names are "<prefix><service>.<tier>"; tests use their own prefix so they never
# consume or purge the demo's queues on the same broker.
RENQ_QUEUE_PREFIX = os.environ.get("RENQ_QUEUE_PREFIX", "")
# Shared state between workers (rate limits, queue-depth stats).
RENQ_REDIS_URL = os.environ.get("RENQ_REDIS_URL", "redis://127.0.0.1:6379/1")
# A job whose worker died is retried this many times in all before it is failed (poison pill).
RENQ_MAX_ATTEMPTS = int(os.environ.get("RENQ_MAX_ATTEMPTS", "3"))
# The device forward passes run on, over a model's own `device` in config.yaml.
RENQ_DEVICE = os.environ.get("RENQ_DEVICE") or None
# CPU workers: cores reserved for the model's forward passes ("0", "0-3", "2,3"); the rest of
# the worker keeps off them (inference.workers.cpu_pinning). Empty: no pinning.
RENQ_MODEL_CPUS = os.environ.get("RENQ_MODEL_CPUS", "")
# Workers that run a model: their nice, and their session's (inference.workers.cpu_pinning).
# 0 (default): the priority they were started with; below it, throughput before the web's
# answers under saturation (docs/batching.md).
RENQ_MODEL_NICE = int(os.environ.get("RENQ_MODEL_NICE", "0"))
# Largest request body accepted (413 above it); Django's own parser limit follows it.
RENQ_MAX_REQUEST_BYTES = int(os.environ.get("RENQ_MAX_REQUEST_BYTES", str(4 * 1024 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = RENQ_MAX_REQUEST_BYTES
# Seconds a result is served from the cache (a service's enable_cache) after its job was sent.
RENQ_RESULT_CACHE_TTL_S = float(os.environ.get("RENQ_RESULT_CACHE_TTL_S", "86400"))
# How long a service's (or the I/O) queues may have no consumer before their jobs are handed
# to the next fallback: longer than a worker restart with its model load.
RENQ_STRANDED_AFTER_S = float(os.environ.get("RENQ_STRANDED_AFTER_S", "30"))
# The most of one tenant's queued jobs (a share of max_queue_size) that count against another
# tenant's room at admission: one tenant's flood or bulk job cannot lock the others out.
RENQ_TENANT_QUEUE_SHARE = float(os.environ.get("RENQ_TENANT_QUEUE_SHARE", "0.25"))
# Seconds between expiry passes (queue_timeout, total_timeout, deadline_ms while jobs wait).
RENQ_EXPIRE_INTERVAL_S = float(os.environ.get("RENQ_EXPIRE_INTERVAL_S", "1"))
# Aging: how often jobs waiting past their tier's threshold are promoted (all due at once).
RENQ_AGING_INTERVAL_S = float(os.environ.get("RENQ_AGING_INTERVAL_S", "1"))
# Seconds between sweeps (outbox, lost messages, stranded jobs, stalled bulks).
RENQ_SWEEP_INTERVAL_S = float(os.environ.get("RENQ_SWEEP_INTERVAL_S", "10"))
# A claim is a lease: its worker renews it every RENQ_LEASE_S / 4 while it holds the job, and a
# lease left to lapse (the host hung, died or was cut off) is taken over by the next check,
# every RENQ_LEASE_CHECK_INTERVAL_S. Long enough to ride out a stalled disk or a GC pause,
# short enough that a hung host's jobs finish elsewhere well inside a realtime timeout.
RENQ_LEASE_S = float(os.environ.get("RENQ_LEASE_S", "12"))
RENQ_LEASE_CHECK_INTERVAL_S = float(os.environ.get("RENQ_LEASE_CHECK_INTERVAL_S", "2"))
# A queued job whose message was confirmed this long ago and has not been claimed is checked
# against its queue, busy or not, and published again if its message is gone.
RENQ_LOST_MESSAGE_AFTER_S = float(os.environ.get("RENQ_LOST_MESSAGE_AFTER_S", "20"))

# json: JSON lines with job id, tenant, tier and backend where the log call passed them
# (renq_site.log_format); Celery workers get the same formatter.
RENQ_LOG_FORMAT = os.environ.get("RENQ_LOG_FORMAT", "plain").strip().lower()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "renq_site.log_format.JsonFormatter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler"}
        | ({"formatter": "json"} if RENQ_LOG_FORMAT == "json" else {})
    },
    "root": {"handlers": ["console"], "level": os.environ.get("RENQ_LOG_LEVEL", "INFO")},
}
