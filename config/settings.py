"""Gantry settings, read from the environment with django-environ.

Every variable is listed with its default in docs/configuration.md.
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
    # First, so that its admin/base_site.html (the admin's shared style) is found before
    # the admin's own, which it extends.
    "apps.core",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc served from here, pinned, offline
    "apps.accounts",
    "apps.fleet",
    "apps.ledger",
    "apps.scheduler",
    "apps.jobs",
    "apps.audit",
]

MIDDLEWARE = [
    "apps.core.middleware.RequestIdMiddleware",
    "apps.core.middleware.RequestGuardMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS, Swagger UI) from the API process itself, under any
    # server; without collectstatic they are found in the apps (WHITENOISE_USE_FINDERS).
    "whitenoise.middleware.WhiteNoiseMiddleware",
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
# A host cut off from the database must notice within seconds, not TCP's minutes: a
# runner stops its generator when its lease runs out, and a blocked heartbeat must not
# keep it from looking. libpq's connect timeout, TCP keepalives and TCP_USER_TIMEOUT
# (unacknowledged data) bound every wait on a silent link (ignored on Unix sockets).
GANTRY_DB_LINK_TIMEOUT_S = env.float("GANTRY_DB_LINK_TIMEOUT_S", default=10.0)
DATABASES["default"].setdefault("OPTIONS", {}).update(
    {
        "connect_timeout": max(2, int(GANTRY_DB_LINK_TIMEOUT_S)),
        "keepalives": 1,
        "keepalives_idle": max(1, int(GANTRY_DB_LINK_TIMEOUT_S / 3)),
        "keepalives_interval": max(1, int(GANTRY_DB_LINK_TIMEOUT_S / 6)),
        "keepalives_count": 3,
        "tcp_user_timeout": int(GANTRY_DB_LINK_TIMEOUT_S * 1000),
    }
)
DATABASES["default"]["CONN_MAX_AGE"] = env.int("GANTRY_DB_CONN_MAX_AGE", default=60)
# Reused connections are pinged at a request's start only after idling a few seconds
# (config/postgresql/base.py): under load that ping was a round trip per request.
DATABASES["default"]["ENGINE"] = "config.postgresql"
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Django turns psycopg's prepared statements off (prepare_threshold None); the ledger's
# hot statements (server-side bound, apps.core.sql.execute) are prepared
# once per connection, which saves re-planning their CTEs on every call. The ORM's
# client-side-bound queries are never prepared either way.
DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
# ...and run with their generic plan. In "auto" mode PostgreSQL compares the generic
# plan's cost with custom plans that know each array parameter's length, finds those
# cheaper, and re-plans a settlement's statement on every call (about 1 ms of CPU, a
# fifth of a reserve+settle pair). Only prepared statements are affected: the ORM's
# queries carry their values inline.
_options = DATABASES["default"]["OPTIONS"].get("options", "")
DATABASES["default"]["OPTIONS"]["options"] = f"{_options} -c plan_cache_mode=force_generic_plan"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
# The admin shows times to the second (config/formats/en/formats.py).
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".data" / "static"
# Serve from the apps' static folders when nothing was collected (make up, tests); a
# deployment that runs collectstatic gets the collected, cache-busted files.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Job outputs: a storage backend, the filesystem by default.
MEDIA_ROOT = Path(env.str("GANTRY_MEDIA_ROOT", default=str(BASE_DIR / ".data" / "media")))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.accounts.authentication.APIKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["apps.accounts.permissions.IsAuthenticatedKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["apps.core.parsers.StrictJSONParser"],
    # drf-spectacular's, plus the error answers of each operation (apps/core/schema.py).
    "DEFAULT_SCHEMA_CLASS": "apps.core.schema.GantryAutoSchema",
    "EXCEPTION_HANDLER": "apps.core.exception_handler.problem_exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gantry API",
    "DESCRIPTION": "Run long, expensive GPU jobs; pay with credits.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/v1",
    # Request bodies get their own components, without the read-only fields.
    "COMPONENT_SPLIT_REQUEST": True,
    # Entries' account and counter_account share one enum.
    "ENUM_NAME_OVERRIDES": {"LedgerAccountEnum": "apps.ledger.models.Account"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        # The job streams and logs are plain async Django views, unseen by drf-spectacular.
        "apps.core.schema.add_plain_views",
    ],
    # Swagger UI and ReDoc from drf-spectacular-sidecar: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery: Redis broker, no result backend (job state lives in PostgreSQL).
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A broker outage must not end runs: a run's fate is its DB lease, and a GPU pool's
# threads cannot be cancelled (Celery dies trying: "does not implement kill_job"). The
# run message, unacked, comes back and is refused by the attempt's fencing token.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
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
    "formatters": {
        "json": {"()": "apps.core.logging.JsonFormatter"},
        "text": {"()": "apps.core.logging.TextFormatter"},
    },
    "filters": {"request_id": {"()": "apps.core.logging.RequestIdFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            # json (default): a JSON object a line; text: a readable line (make up's terminal)
            "formatter": env.str("GANTRY_LOG_FORMAT", default="json"),
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": env.str("GANTRY_LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Celery's line per task received and per task done. The launcher quiets it on the
        # control worker (GANTRY_TASK_LOG_LEVEL=WARNING), whose housekeeping runs every few
        # seconds and would bury the work; the services log what each task decided.
        "celery.app.trace": {"level": env.str("GANTRY_TASK_LOG_LEVEL", default="INFO")},
        "celery.worker.strategy": {"level": env.str("GANTRY_TASK_LOG_LEVEL", default="INFO")},
        # Beat's "Sending due task" every second; the launcher sets WARNING for it too.
        "celery.beat": {"level": env.str("GANTRY_TASK_LOG_LEVEL", default="INFO")},
    },
}

# --- Tenancy and admission -------------------------------------------------------------
# Seconds a process may reuse a looked-up API key (a revocation's worst-case delay).
GANTRY_API_KEY_CACHE_S = env.float("GANTRY_API_KEY_CACHE_S", default=5.0)
GANTRY_TIER_DEFAULTS = {
    # max queued / running jobs per org, submissions per second (token bucket) per org
    "free": {"max_queued": 20, "max_running": 4, "rate_per_s": 2.0, "burst": 10},
    "paid": {"max_queued": 500, "max_running": 64, "rate_per_s": 50.0, "burst": 200},
    "enterprise": {"max_queued": 10000, "max_running": 1024, "rate_per_s": 500.0, "burst": 2000},
}

# --- Fleet and scheduling -------------------------------------------------------------
GANTRY_FLEET_FILE = env.str("GANTRY_FLEET_FILE", default="")

# --- Jobs (submission, admission, results, webhooks) ----------------------------------
# Per-tier bounds on a job's max_runtime_s (seconds).
GANTRY_TIER_RUNTIME_LIMITS = {
    "free": {"min_runtime_s": 10, "max_runtime_s": 30 * 60},
    "paid": {"min_runtime_s": 10, "max_runtime_s": 24 * 3600},
    "enterprise": {"min_runtime_s": 10, "max_runtime_s": 7 * 24 * 3600},
}
# Largest accepted `params` document, as canonical JSON bytes.
GANTRY_MAX_PARAMS_BYTES = env.int("GANTRY_MAX_PARAMS_BYTES", default=64 * 1024)
# GPU types (names, memory, prices) are cached per process for this long.
GANTRY_GPU_TYPE_CACHE_S = env.float("GANTRY_GPU_TYPE_CACHE_S", default=10.0)
# Tier-wide token buckets shared by every org of the tier. Only the free tier has one, so
# under overload free submissions are refused (429) first and paid work never is.
GANTRY_TIER_AGGREGATE_RATE = {"free": {"rate_per_s": 50.0, "burst": 200}}
# A grant of at least 2 x GANTRY_LEDGER_LANE_MIN micro-credits is issued as up to
# GANTRY_LEDGER_BUCKET_LANES lanes (bucket rows of one rank) that concurrent holds draw
# from side by side, and a budget with such a limit is kept in as many lanes: one busy
# org does not queue on one bucket or budget row.
GANTRY_LEDGER_BUCKET_LANES = env.int("GANTRY_LEDGER_BUCKET_LANES", default=16)
GANTRY_LEDGER_LANE_MIN = env.int("GANTRY_LEDGER_LANE_MIN", default=1_000_000_000)
# A running job's live usage is captured into the ledger at most this often (and when
# its hold settles): one capture entry a minute per running job, not one per heartbeat.
GANTRY_LEDGER_CAPTURE_INTERVAL_S = env.float("GANTRY_LEDGER_CAPTURE_INTERVAL_S", default=60.0)
# A job's credit hold may be reclaimed by recovery only after max_runtime_s plus this.
GANTRY_HOLD_QUEUE_ALLOWANCE_S = env.int("GANTRY_HOLD_QUEUE_ALLOWANCE_S", default=24 * 3600)
# Past this many queued jobs platform-wide, free-tier submissions are shed with a 429.
GANTRY_SHED_FREE_QUEUE_DEPTH = env.int("GANTRY_SHED_FREE_QUEUE_DEPTH", default=5000)
GANTRY_SHED_RETRY_AFTER_S = 30
# Retry-After of a 429 for a full per-org queue (max_queued).
GANTRY_QUOTA_RETRY_AFTER_S = 30
# Within this many jobs of an org's max_queued, submissions of the org serialise on an
# advisory lock so the quota is exact where it matters and free elsewhere.
GANTRY_QUOTA_LOCK_MARGIN = 64
# Webhooks: https only unless allowed; hosts named here may resolve to private addresses.
GANTRY_WEBHOOK_ALLOW_HTTP = env.bool("GANTRY_WEBHOOK_ALLOW_HTTP", default=False)
GANTRY_WEBHOOK_ALLOWED_HOSTS = env.list("GANTRY_WEBHOOK_ALLOWED_HOSTS", default=[])
# Master key from which each org's webhook secret is derived (rotate by changing it).
GANTRY_WEBHOOK_SIGNING_KEY = env.str("GANTRY_WEBHOOK_SIGNING_KEY", default=SECRET_KEY)
GANTRY_WEBHOOK_TIMEOUT_S = env.float("GANTRY_WEBHOOK_TIMEOUT_S", default=10.0)
GANTRY_WEBHOOK_MAX_TRIES = env.int("GANTRY_WEBHOOK_MAX_TRIES", default=8)
GANTRY_WEBHOOK_BACKOFF_BASE_S = env.float("GANTRY_WEBHOOK_BACKOFF_BASE_S", default=5.0)
GANTRY_WEBHOOK_BACKOFF_MAX_S = env.float("GANTRY_WEBHOOK_BACKOFF_MAX_S", default=600.0)
# Results: "filesystem" (under MEDIA_ROOT) or "s3" (any S3-compatible store; needs boto3).
GANTRY_RESULT_STORAGE = env.str("GANTRY_RESULT_STORAGE", default="filesystem")
# Each attempt's generator output (stdout and stderr) is kept up to this many bytes: the
# first and the last half of a longer one, with a line saying what was cut.
GANTRY_LOG_LIMIT_BYTES = env.int("GANTRY_LOG_LIMIT_BYTES", default=1024 * 1024)
GANTRY_RESULT_URL_TTL_S = env.int("GANTRY_RESULT_URL_TTL_S", default=3600)
GANTRY_S3_BUCKET = env.str("GANTRY_S3_BUCKET", default="")
GANTRY_S3_PREFIX = env.str("GANTRY_S3_PREFIX", default="results/")
GANTRY_S3_ENDPOINT_URL = env.str("GANTRY_S3_ENDPOINT_URL", default="")
GANTRY_S3_REGION = env.str("GANTRY_S3_REGION", default="")
# Checkpoints: "" (as GANTRY_RESULT_STORAGE), "filesystem" (GANTRY_CHECKPOINT_ROOT, shared
# by every node) or "s3" (GANTRY_S3_BUCKET under this prefix; apps/jobs/services/checkpoints.py).
GANTRY_CHECKPOINT_STORAGE = env.str("GANTRY_CHECKPOINT_STORAGE", default="")
GANTRY_S3_CHECKPOINT_PREFIX = env.str("GANTRY_S3_CHECKPOINT_PREFIX", default="checkpoints/")

# --- Worker pools (the black-box runner and recovery) ---------------------------------
# The generator binary; gets --params/--output-dir/--checkpoint-dir [--resume] (docs/api.md).
# Space-separated in the environment; empty: the bundled stand-in, run by this Python.
GANTRY_GENERATOR_COMMAND = env.str("GANTRY_GENERATOR_COMMAND", default="").split()
# The JSON Schema file `params` must satisfy (checked at submission, served at
# /v1/generator/schema). Default: the stand-in's own while it is the generator, none for
# another command (set it to that generator's schema; empty turns the check off).
GANTRY_GENERATOR_PARAMS_SCHEMA = env.str(
    "GANTRY_GENERATOR_PARAMS_SCHEMA",
    default=""
    if GANTRY_GENERATOR_COMMAND
    else str(BASE_DIR / "apps" / "jobs" / "standin_generator.params.schema.json"),
)
# Per-attempt scratch folders (params.json, output dir); node-local, removed after a run.
GANTRY_SCRATCH_ROOT = Path(
    env.str("GANTRY_SCRATCH_ROOT", default=str(BASE_DIR / ".data" / "scratch"))
)
# Checkpoints on the filesystem backend live in MEDIA_ROOT/checkpoints/<job id>: a
# filesystem every node shares, so a retry or resume on another node finds them (with
# GANTRY_CHECKPOINT_STORAGE s3 the object store holds them instead).
GANTRY_CHECKPOINT_ROOT = MEDIA_ROOT / "checkpoints"
GANTRY_HEARTBEAT_S = env.float("GANTRY_HEARTBEAT_S", default=2.0)
# How often a GPU-pool worker says it is alive for its nodes (apps/fleet/liveness.py).
GANTRY_WORKER_PULSE_S = env.float("GANTRY_WORKER_PULSE_S", default=10.0)
# A running attempt whose lease (database clock) runs out is lost: its worker is dead.
GANTRY_LEASE_S = env.float("GANTRY_LEASE_S", default=30.0)
# A process holding a singleton lock (dispatcher, folds, the beat's leadership) that goes
# silent this long loses it: its session ends itself (apps.core.locks).
GANTRY_LOCK_IDLE_TIMEOUT_S = env.float("GANTRY_LOCK_IDLE_TIMEOUT_S", default=10.0)
# No output line for this long: the generator is hung and gets killed.
GANTRY_STALL_S = env.float("GANTRY_STALL_S", default=300.0)
# SIGTERM → this long to checkpoint and exit → SIGKILL (preemption).
GANTRY_PREEMPT_GRACE_S = env.float("GANTRY_PREEMPT_GRACE_S", default=30.0)
# Retry backoff: base * 2^(failures - 1), capped.
GANTRY_RETRY_BACKOFF_S = env.float("GANTRY_RETRY_BACKOFF_S", default=10.0)
GANTRY_RETRY_BACKOFF_MAX_S = env.float("GANTRY_RETRY_BACKOFF_MAX_S", default=600.0)
# Out-of-memory exits retried at most this many times (another node may have more room).
GANTRY_OOM_RETRIES = env.int("GANTRY_OOM_RETRIES", default=1)
# A params fingerprint that hung or crashed on this many different nodes is quarantined.
GANTRY_QUARANTINE_NODES = env.int("GANTRY_QUARANTINE_NODES", default=3)
# How often the recovery beat tasks run.
GANTRY_RECOVERY_INTERVAL_S = env.float("GANTRY_RECOVERY_INTERVAL_S", default=5.0)
# How often queued jobs past their start deadline (start_deadline_s) are cancelled; the
# dispatcher never places them meanwhile, so this only decides how soon they end.
GANTRY_START_DEADLINE_INTERVAL_S = env.float("GANTRY_START_DEADLINE_INTERVAL_S", default=5.0)
# The run task never depends on a broker or pool time limit: the runner enforces
# max_runtime_s itself and the DB lease detects a dead worker.
CELERY_TASK_TIME_LIMIT = None
CELERY_TASK_SOFT_TIME_LIMIT = None

# --- Scheduler --------------------------------------------------------------------------
# Dispatch tick period (beat); submissions and finishes also wake it early.
GANTRY_DISPATCH_INTERVAL_S = env.float("GANTRY_DISPATCH_INTERVAL_S", default=1.0)
# How often a tick also explains the queue (each waiting job's position, reason and
# estimated start, published for its tenant); entries expire after a few of these.
GANTRY_QUEUE_STATE_INTERVAL_S = env.float("GANTRY_QUEUE_STATE_INTERVAL_S", default=5.0)
# A tick applies its decisions for at most this long (at least one decision, or one group
# of placements sized to fit what is left at the last group's pace); the rest are decided
# again by a round that starts at once, with what was submitted meanwhile. A burst's
# hundreds of placements (100-170 ms each on a 2-core host busy running them, alone or in
# groups; 2-3 ms in groups on an idle one) then keep a job that arrives during them (an
# enterprise job behind paid ones) waiting about this long, not for the whole burst.
GANTRY_DISPATCH_APPLY_BUDGET_S = env.float("GANTRY_DISPATCH_APPLY_BUDGET_S", default=2.0)
# A placed attempt must be claimed by its node's worker within this, else it is requeued.
GANTRY_SCHEDULING_LEASE_S = env.int("GANTRY_SCHEDULING_LEASE_S", default=60)
# An attempt still unclaimed this long after placement gets its run message re-sent.
GANTRY_REPUBLISH_AFTER_S = env.int("GANTRY_REPUBLISH_AFTER_S", default=10)
# A claim on a node (GPUs freed by a preemption or drained by a reservation) for a queued
# job is dropped if the job is not placed by then.
GANTRY_NODE_CLAIM_TTL_S = env.int("GANTRY_NODE_CLAIM_TTL_S", default=600)
GANTRY_USAGE_HALF_LIFE_S = env.float("GANTRY_USAGE_HALF_LIFE_S", default=1800.0)
GANTRY_DISPATCH_DECISION_RETENTION_DAYS = env.int(
    "GANTRY_DISPATCH_DECISION_RETENTION_DAYS", default=30
)
# Other knobs of apps.scheduler.policy.PolicyConfig, by name (e.g. {"scan_budget": 800,
# "tier_floors": {"free": 0.1}}: a per-tier knob may name only the tiers it changes; a
# wrong knob stops `manage.py migrate`/`check` with its name, gantry.E001);
# how much of the queue a tick reads is queue_window_jobs / queue_depth_per_user /
# queue_window_max_jobs there.
GANTRY_POLICY = env.json("GANTRY_POLICY", default={})


# --- Periodic tasks (Celery beat): the one schedule ------------------------------------
# Every entry runs on the control queue and expires about when the next one is due, so a
# beat that was down does not replay a backlog of stale runs; every task is safe to run
# twice at once (advisory locks, row locks, guarded updates).
_TICK_S = float(GANTRY_DISPATCH_INTERVAL_S)
_RECOVERY_S = float(GANTRY_RECOVERY_INTERVAL_S)


def _every(task: str, seconds: float, *, expires: float | None = None) -> dict:
    return {
        "task": task,
        "schedule": seconds,
        "options": {"queue": "control", "expires": seconds if expires is None else expires},
    }


# One beat sends, however many control hosts run one (apps.core.beat).
CELERY_BEAT_SCHEDULER = "apps.core.beat:LeaderScheduler"
CELERY_BEAT_SCHEDULE = {
    # The dispatch tick (submissions and finishes also wake it early).
    "scheduler-dispatch-tick": _every(
        "gantry.scheduler.dispatch_tick", _TICK_S, expires=max(1.0, 2 * _TICK_S)
    ),
    # Run messages lost between placement and claim are re-sent, then requeued.
    "scheduler-recover-unclaimed-attempts": _every(
        "gantry.scheduler.recover_unclaimed_attempts", _RECOVERY_S
    ),
    "scheduler-prune-dispatch-decisions": _every(
        "gantry.scheduler.prune_dispatch_decisions", 3600.0, expires=1800.0
    ),
    # Attempts whose worker died (lease run out), holds left open by a crash.
    "jobs-reap-expired-leases": _every("gantry.jobs.reap_expired_leases", _RECOVERY_S),
    "jobs-close-stranded-holds": _every("gantry.jobs.close_stranded_holds", 60.0),
    # Queued jobs that never started by their start deadline: cancelled, hold released.
    "jobs-cancel-past-start-deadline": _every(
        "gantry.jobs.cancel_jobs_past_start_deadline", float(GANTRY_START_DEADLINE_INTERVAL_S)
    ),
    "jobs-redeliver-webhooks": _every("gantry.jobs.redeliver_webhooks", 600.0, expires=300.0),
    # The ledger: usage reports folded in, expiry, and the invariants checked.
    "ledger-fold-usage-reports": _every("gantry.ledger.fold_usage_reports", 1.0, expires=2.0),
    "ledger-expire-buckets": _every("gantry.ledger.expire_buckets", 15.0),
    "ledger-expire-stale-holds": _every("gantry.ledger.expire_stale_holds", 15.0),
    "ledger-reconcile": _every("gantry.ledger.reconcile", 60.0),
}
