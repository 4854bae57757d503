"""Gantry settings, read from the environment with django-environ.

Every variable is listed with its default in README.md ("Configuration").
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("GANTRY_DEBUG", default=False)
SECRET_KEY = env.str(
    "GANTRY_SECRET_KEY", default="gantry-dev-insecure-secret-key-change-me-0123456789"
)
ALLOWED_HOSTS = env.list("GANTRY_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
PUBLIC_URL = env.str("GANTRY_PUBLIC_URL", default="http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "apps.accounts",
    "apps.ledger",
    "apps.scheduler",
    "apps.jobs",
]

MIDDLEWARE = [
    "apps.api.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

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

# PostgreSQL only. The launcher sets DATABASE_URL (embedded server or yours).
DATABASES = {"default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/gantry")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("GANTRY_DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".data" / "static"

# Job outputs: a storage backend, the filesystem by default.
MEDIA_ROOT = Path(env.str("GANTRY_MEDIA_ROOT", default=str(BASE_DIR / ".data" / "media")))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.accounts.authentication.APIKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.IsAuthenticatedKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.api.exception_handler.problem_exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gantry API",
    "DESCRIPTION": "Run long, expensive GPU jobs; pay with credits.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/v1",
}

# Celery: Redis broker, no result backend (job state lives in PostgreSQL).
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The DB lease decides whether a job runs; a redelivery after this is harmless.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("GANTRY_VISIBILITY_TIMEOUT_S", default=3600)
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TASK_SEND_SENT_EVENT = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "apps.api.logging.JsonFormatter"}},
    "filters": {"request_id": {"()": "apps.api.logging.RequestIdFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": env.str("GANTRY_LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Tenancy and admission -------------------------------------------------------------
GANTRY_TIER_DEFAULTS = {
    # max queued / running jobs per org, submissions per second (token bucket) per org
    "free": {"max_queued": 20, "max_running": 4, "rate_per_s": 2.0, "burst": 10},
    "paid": {"max_queued": 500, "max_running": 64, "rate_per_s": 50.0, "burst": 200},
    "enterprise": {"max_queued": 10000, "max_running": 1024, "rate_per_s": 500.0, "burst": 2000},
}

# --- Fleet and scheduling -------------------------------------------------------------
GANTRY_FLEET_FILE = env.str("GANTRY_FLEET_FILE", default="")
