"""Job submission: validate the spec, hold credit, create the queued job, all or nothing.

Admission runs in this order (the view does the first two, Redis-side):
auth → rate limit / overload (services.admission) → validation → [one transaction:
idempotency lock and replay → quarantine (422) → dedup → queue quota → credit hold
(ledger.reserve) → Job(queued) + JobEvent] → on commit: wake the dispatcher.

The hot path is written for few round trips (about a dozen queries per submission,
most of them the ledger's): the lock and every admission read share one round trip,
and the job and its event are inserted by one statement.

Idempotency: the Idempotency-Key is scoped to the org. Concurrent submissions with one
key serialise on a transaction-scoped advisory lock; the first creates the job and its
hold, the others find the job and answer it again (same id, its current state). The
same key with a different request body is a 409. The hold's own idempotency key is
derived from the org and the Idempotency-Key, so credits are never held twice.
A submission that fails (402, 403, 429...) leaves nothing behind and may be retried
with the same key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models.expressions import DatabaseDefault
from django.db.models.functions import Now
from django.utils import timezone

from apps.accounts.models import Org, Project, User
from apps.core import locks
from apps.core.errors import Conflict, GantryError
from apps.core.sql import execute, execute_last
from apps.fleet import selectors as fleet
from apps.fleet.selectors import GpuTypeInfo
from apps.jobs import selectors
from apps.jobs.models import Job, JobEvent, JobStatus
from apps.jobs.services import admission, webhooks
from apps.jobs.validation import MAX_GPU_COUNT


@dataclass(frozen=True)
class JobSpec:
    """What a tenant asks for (validated by validate_spec)."""

    params: dict
    max_runtime_s: int
    gpu_count: int = 1
    gpu_types: tuple[str, ...] = ()
    min_gpu_memory_gb: int = 0
    preemptible: bool = True
    webhook_url: str = ""

    @property
    def resources(self) -> dict:
        return {
            "gpu_count": self.gpu_count,
            "gpu_types": list(self.gpu_types),
            "min_gpu_memory_gb": self.min_gpu_memory_gb,
        }


@dataclass(frozen=True)
class Submission:
    job: Job
    replayed: bool = False
    deduplicated: bool = False
    allowed_types: list[GpuTypeInfo] = field(default_factory=list)


class Quarantined(GantryError):
    status_code = 422
    code = "quarantined"


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of(spec: JobSpec) -> str:
    """sha256 of the canonical params + resources: what dedup and quarantine match on."""
    document = canonical_json({"params": spec.params, "resources": spec.resources})
    return hashlib.sha256(document.encode()).hexdigest()


def request_digest_of(body) -> str:
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def spec_of(job: Job) -> JobSpec:
    """The spec a job was submitted with (for a requeued copy)."""
    return JobSpec(
        params=job.params,
        max_runtime_s=job.max_runtime_s,
        gpu_count=job.gpu_count,
        gpu_types=tuple(job.gpu_types),
        min_gpu_memory_gb=job.min_gpu_memory_gb,
        preemptible=job.preemptible,
        webhook_url=job.webhook_url,
    )


def allowed_gpu_types(spec: JobSpec) -> list[GpuTypeInfo]:
    """The GPU types the job may run on (listed ones, or all), that meet its memory floor.

    Raises a 400 naming `resources.gpu_types` for an unknown type and
    `resources.min_gpu_memory_gb` when no allowed type has that much memory.
    """
    types = fleet.gpu_types()
    if any(name not in types for name in spec.gpu_types):
        types = fleet.gpu_types(refresh=True)  # a type added since the cache filled
    unknown = [name for name in spec.gpu_types if name not in types]
    if unknown:
        raise GantryError(
            f"resources.gpu_types: unknown GPU type {unknown[0]!r}; "
            f"known: {', '.join(sorted(types)) or 'none'}.",
            code="invalid",
            field="resources.gpu_types",
        )
    candidates = [types[name] for name in spec.gpu_types] if spec.gpu_types else types.values()
    allowed = [t for t in candidates if t.memory_gb >= spec.min_gpu_memory_gb]
    if not allowed:
        best = max((t.memory_gb for t in candidates), default=0)
        raise GantryError(
            f"resources.min_gpu_memory_gb: no allowed GPU type has {spec.min_gpu_memory_gb} GB "
            f"(the most is {best} GB).",
            code="invalid",
            field="resources.min_gpu_memory_gb",
        )
    return allowed


def validate_spec(spec: JobSpec, *, tier: str) -> list[GpuTypeInfo]:
    """Check everything about the spec that does not need a lock; the allowed GPU types.

    Every refusal is a 400 naming the field.
    """
    if not isinstance(spec.params, dict):
        raise GantryError("params: expected an object.", code="invalid", field="params")
    size = len(canonical_json(spec.params).encode())
    if size > settings.GANTRY_MAX_PARAMS_BYTES:
        raise GantryError(
            f"params: {size} bytes is more than the {settings.GANTRY_MAX_PARAMS_BYTES} allowed.",
            code="invalid",
            field="params",
        )
    if not 1 <= spec.gpu_count <= MAX_GPU_COUNT:
        raise GantryError(
            f"resources.gpu_count: must be between 1 and {MAX_GPU_COUNT}.",
            code="invalid",
            field="resources.gpu_count",
        )
    limits = settings.GANTRY_TIER_RUNTIME_LIMITS[tier]
    low, high = limits["min_runtime_s"], limits["max_runtime_s"]
    if not low <= spec.max_runtime_s <= high:
        raise GantryError(
            f"max_runtime_s: the {tier} tier allows {low} to {high} seconds.",
            code="invalid",
            field="max_runtime_s",
        )
    allowed = allowed_gpu_types(spec)
    if spec.webhook_url:
        webhooks.check_target(spec.webhook_url)
    return allowed


def hold_amount(spec: JobSpec, allowed: list[GpuTypeInfo]) -> int:
    """Micro-credits to hold: the whole runtime on the priciest allowed type, rounded up."""
    price = max(t.price_per_gpu_hour for t in allowed)
    return max(1, math.ceil(spec.max_runtime_s * spec.gpu_count * price / 3600))


def resolve_project(org: Org, ref, *, key_project: Project | None = None) -> Project:
    """The org's project named by id or name; a key narrowed to a project may only use it.

    Unknown (or another org's) project: 400 naming `project`. Another project than the
    key's: 403.
    """
    if ref in (None, ""):
        if key_project is not None:
            return key_project
        raise GantryError("project: this field is required.", code="invalid", field="project")
    ref = str(ref)
    if key_project is not None and ref in (str(key_project.id), key_project.name):
        return key_project
    project = _find_project(org, ref)
    if project is None:
        raise GantryError(
            f"project: no project {ref!r} in this org.", code="invalid", field="project"
        )
    if key_project is not None and project.id != key_project.id:
        raise GantryError(
            "project: this API key may only submit to its own project.",
            code="forbidden",
            field="project",
            status_code=403,
        )
    return project


_PROJECT_SQL = """
SELECT id, org_id, name, created_at FROM accounts_project
WHERE org_id = %(org)s AND (id = %(id)s OR name = %(name)s)
ORDER BY id = %(id)s DESC NULLS LAST
LIMIT 1
"""


def _find_project(org: Org, ref: str) -> Project | None:
    """The org's project with this id (preferred) or name, in one plain query (hot path);
    its row is remembered a few seconds by this process (the API never deletes one)."""
    from apps.accounts.caches import project_memo

    row = project_memo.get((org.id, ref))
    if row is None:
        project_id = None
        with contextlib.suppress(ValueError):
            project_id = uuid.UUID(ref)
        with connection.cursor() as cursor:
            cursor.execute(_PROJECT_SQL, {"org": org.id, "id": project_id, "name": ref})
            row = cursor.fetchone()
        if row is None:
            return None
        project_memo.put((org.id, ref), row)
    project = Project.from_db("default", ["id", "org_id", "name", "created_at"], row)
    project.org = org
    return project


def quarantine_error() -> Quarantined:
    return Quarantined(
        "params: these params and resources are quarantined: they crashed or hung on "
        "several nodes. Change them, or ask an operator to clear the quarantine.",
        field="params",
    )


@dataclass(frozen=True)
class _AdmissionSnapshot:
    existing_job_id: uuid.UUID | None
    quarantined: bool
    queued: int


# The submission hot path reads what admission needs in one round trip (after the
# idempotency lock, so a job committed by the lock's previous holder is visible).
_LOCK_SQL = f"SELECT {locks.xact_lock_sql('%(lock)s')}"
_SNAPSHOT_SQL = """
SELECT
    (SELECT id FROM jobs_job WHERE org_id = %(org)s AND idempotency_key = %(key)s),
    EXISTS (SELECT 1 FROM jobs_quarantinedfingerprint WHERE fingerprint = %(fp)s),
    (SELECT count(*) FROM (
        SELECT FROM jobs_job WHERE org_id = %(org)s AND status = %(queued)s LIMIT %(up_to)s
    ) AS queued)
"""


def _lock_and_read(org_id, key: str, fingerprint: str, *, up_to: int) -> _AdmissionSnapshot:
    """Take the (org, Idempotency-Key) lock for this transaction, then read the snapshot.

    The org's queued jobs are counted up to `up_to` (its queue quota): what the quota
    check needs, at a cost that does not grow with a long queue."""
    # Two prepared statements, one round trip (a pipeline): in READ COMMITTED each
    # statement takes its own snapshot, so the read runs after the lock is granted and
    # sees what the lock's previous holder committed.
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    with db.connection.pipeline():
        execute(db.connection, _LOCK_SQL, {"lock": f"job-submit|{org_id}|{key}"})
        cursor = execute(
            db.connection,
            _SNAPSHOT_SQL,
            {
                "org": org_id,
                "key": key,
                "fp": fingerprint,
                "queued": JobStatus.QUEUED.value,
                "up_to": up_to,
            },
        )
    existing, quarantined, queued = cursor.fetchone()
    return _AdmissionSnapshot(existing, quarantined, queued)


def hold_key(org_id, idempotency_key: str) -> str:
    digest = hashlib.sha256(f"{org_id}|{idempotency_key}".encode()).hexdigest()
    return f"job-submit:{digest}"


def submit_job(
    *,
    org: Org,
    project: Project,
    spec: JobSpec,
    user: User | None = None,
    idempotency_key: str | None = None,
    request_digest: str = "",
    actor: str = "api",
    reason: str = "submitted",
    enforce_quota: bool = True,
    allow_dedup: bool = True,
) -> Submission:
    """Admit one job: validated, quota-checked, credit held, queued, in one transaction.

    Guarantees: either the job exists queued with an active hold and a `queued` event,
    or nothing was written (the error says why: 400, 402, 403, 409, 422, 429). The same
    `idempotency_key` returns the same job (`replayed`) and never holds twice; with a
    different `request_digest` it is a 409. With the org's dedup on, an identical spec
    returns a new job that is already succeeded and reuses the earlier result, with no
    hold and no charge (`deduplicated`). Rate limits are the caller's (admission.admit).
    """
    from apps.core.wakeup import wake_dispatcher
    from apps.ledger import services as ledger

    allowed = validate_spec(spec, tier=org.tier)
    fingerprint = fingerprint_of(spec)
    key = idempotency_key or f"internal:{uuid.uuid4()}"
    with transaction.atomic():
        quota = admission.org_limits(org).max_queued if enforce_quota else 0
        snapshot = _lock_and_read(org.id, key, fingerprint, up_to=quota)
        if snapshot.existing_job_id is not None:
            existing = Job.objects.select_related("hold").get(pk=snapshot.existing_job_id)
            if existing.request_digest != request_digest:
                raise Conflict(
                    "This Idempotency-Key was used with a different request body.",
                    code="idempotency_mismatch",
                    field="Idempotency-Key",
                )
            return Submission(job=existing, replayed=True, allowed_types=allowed)
        if snapshot.quarantined:
            raise quarantine_error()

        common = {
            "org": org,
            "project": project,
            "user": user,
            "tier": org.tier,
            "params": spec.params,
            "gpu_count": spec.gpu_count,
            "gpu_types": list(spec.gpu_types),
            "min_gpu_memory_gb": spec.min_gpu_memory_gb,
            "max_runtime_s": spec.max_runtime_s,
            "preemptible": spec.preemptible,
            "webhook_url": spec.webhook_url,
            "fingerprint": fingerprint,
            "idempotency_key": key,
            "request_digest": request_digest,
            "queued_at": Now(),
        }
        if allow_dedup and org.dedup_enabled:
            source = selectors.dedup_source(org.id, fingerprint)
            if source is not None:
                job = _create_deduplicated(common, source=source, actor=actor)
                return Submission(job=job, deduplicated=True, allowed_types=allowed)

        if enforce_quota:
            admission.check_queue_quota(org, queued=snapshot.queued)
        job_id = uuid.uuid4()
        amount = hold_amount(spec, allowed)
        hold = ledger.reserve(
            org=org,
            amount=amount,
            idempotency_key=hold_key(org.id, key),
            project=project,
            user=user,
            job_id=job_id,
            # Recovery may reclaim the hold only after the job could have waited in the
            # queue and then run for its whole max runtime.
            expires_at=timezone.now()
            + timedelta(seconds=spec.max_runtime_s + settings.GANTRY_HOLD_QUEUE_ALLOWANCE_S),
        )
        job = Job(id=job_id, status=JobStatus.QUEUED, hold=hold, **common)
        event = JobEvent(
            job=job,
            from_status="",
            to_status=JobStatus.QUEUED,
            reason=reason,
            actor=actor,
            data={"hold": str(hold.id), "amount": hold.amount, **_request_of_submission()},
        )
        wake_dispatcher()  # on commit
        # The reserve locked the org's credit buckets: from here to the commit is one
        # round trip (the COMMIT goes with the INSERT), so they stay locked as briefly
        # as possible. Nothing may follow it in this block.
        insert_rows(job, event, last=True)
    return Submission(job=job, allowed_types=allowed)


def _request_of_submission() -> dict:
    """{"request_id": X-Request-Id} of the submitting request, kept with the job so that
    the log lines of its runs name it (apps.core.logging)."""
    from apps.core.logging import current_request_id

    request_id = current_request_id()
    return {"request_id": request_id} if request_id else {}


def insert_rows(*instances, last: bool = False) -> None:
    """INSERT new model instances in one statement and one round trip.

    What Model.save() would write for each concrete field (auto_now_add and Python
    defaults applied; database defaults left to the database; Now() as the statement's
    timestamp, like Django's), without its per-row query compilation: this is the
    submission hot path. Plain rows only: no signals, no auto-increment primary keys
    returned. Foreign keys among the rows are checked at commit (Django creates them
    DEFERRABLE INITIALLY DEFERRED), so the order of the inserts does not matter.

    `last`: nothing else runs in the current atomic block after this; if it is the
    outermost block, the COMMIT is sent with the INSERT (apps.core.sql.execute_last).
    """
    db = connections[DEFAULT_DB_ALIAS]  # the real wrapper: the proxy costs per access
    shape, params = [], []
    for instance in instances:
        kinds = []
        for model_field in _insert_fields(type(instance)):
            value = model_field.pre_save(instance, add=True)
            if isinstance(value, DatabaseDefault) or (
                value is None and model_field.primary_key and model_field.db_returning
            ):
                kinds.append(_DEFAULT)  # the database fills it in
            elif isinstance(value, Now):
                kinds.append(_NOW)
            elif hasattr(value, "resolve_expression"):
                raise TypeError(f"{model_field.name}: unsupported expression {value!r}")
            else:
                kinds.append(_VALUE)
                params.append(model_field.get_db_prep_save(value, db))
        shape.append((type(instance), tuple(kinds)))
    shape = tuple(shape)
    sql = _insert_sql.get(shape)
    if sql is None:
        sql = _insert_sql[shape] = _build_insert_sql(shape, db.ops.quote_name)
    if last:
        execute_last(db, sql, params)
    else:
        db.ensure_connection()
        execute(db.connection, sql, params)
    for instance in instances:
        instance._state.adding = False
        instance._state.db = db.alias


# How insert_rows writes each column of a row.
_VALUE, _NOW, _DEFAULT = "value", "now", "default"
# The statement text depends only on the models and which columns are defaulted or Now():
# built once per such shape (its columns walked and quoted once, not per submission).
_insert_sql: dict[tuple, str] = {}


@functools.cache
def _insert_fields(model) -> tuple:
    return tuple(model._meta.concrete_fields)


def _build_insert_sql(shape: tuple, quote) -> str:
    statements = []
    for model, kinds in shape:
        columns, values = [], []
        for model_field, kind in zip(_insert_fields(model), kinds, strict=True):
            if kind == _DEFAULT:
                continue
            columns.append(quote(model_field.column))
            values.append("STATEMENT_TIMESTAMP()" if kind == _NOW else "%s")
        table = quote(model._meta.db_table)
        # Identifiers from model metadata (quoted); every value is a bound parameter.
        statements.append(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(values)})"  # noqa: S608
        )
    # Data-modifying CTEs: all rows in one statement of the current transaction, bound
    # server-side and prepared.
    *first, last = statements
    ctes = ", ".join(f"w{i} AS ({stmt})" for i, stmt in enumerate(first))
    return f"WITH {ctes} {last}" if ctes else last


def _create_deduplicated(common: dict, *, source: Job, actor: str) -> Job:
    """A new job, already succeeded, returning `source`'s result; nothing is held."""
    original_id = source.reused_from_id or source.id
    job = Job.objects.create(
        status=JobStatus.SUCCEEDED,
        reused_from_id=original_id,
        result_path=source.result_path,
        gpu_type=source.gpu_type,
        progress=1.0,
        finished_at=Now(),
        **common,
    )
    JobEvent.objects.create(
        job=job,
        from_status="",
        to_status=JobStatus.SUCCEEDED,
        reason=f"deduplicated: identical to job {original_id}, whose result is reused (no charge)",
        actor=actor,
        data={"reused_from": str(original_id)},
    )
    if job.webhook_url:
        transaction.on_commit(lambda: webhooks.enqueue_delivery(job.id))
    job.refresh_from_db()
    return job


def requeue_failed_job(job_id, *, actor: str) -> Job:
    """Run a dead-lettered (failed) job again as a NEW job with a fresh hold.

    The state machine keeps `failed` final (its hold is settled; its history stays as
    it was), so a requeue is a copy: same org, project, user and spec, linked both ways
    in the event logs. Requeuing the same job twice returns the same copy. Quotas do
    not apply (an operator decided); credits, budgets and quarantine do.
    """
    original = Job.objects.select_related("org", "project", "user").get(pk=job_id)
    if original.status != JobStatus.FAILED:
        raise Conflict(
            f"Job {original.id} is {original.status}; only a failed (dead-lettered) job "
            "can be requeued.",
            code="not_dead_lettered",
            field="status",
        )
    from apps.jobs.services.lifecycle import record_event

    with transaction.atomic():
        submission = submit_job(
            org=original.org,
            project=original.project,
            user=original.user,
            spec=spec_of(original),
            idempotency_key=f"gantry-requeue:{original.id}",
            request_digest=f"requeue:{original.id}",
            actor=actor,
            reason=f"requeued copy of dead-lettered job {original.id}",
            enforce_quota=False,
            allow_dedup=False,
        )
        if not submission.replayed:
            record_event(
                original,
                reason=f"requeued as job {submission.job.id}",
                actor=actor,
                data={"requeued_as": str(submission.job.id)},
            )
    return submission.job
