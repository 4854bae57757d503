"""Reads of jobs, scoped to the caller, and the small cached reads of the submission path."""

from __future__ import annotations

from django.db.models import Count, Exists, OuterRef, QuerySet
from django.shortcuts import get_object_or_404

from apps.jobs.models import (
    Attempt,
    Job,
    JobEvent,
    JobStatus,
    QuarantinedFingerprint,
    WebhookEvent,
)
from apps.jobs.services.exits import FAILURE_CLASSES

OUTSTANDING_STATUSES = (
    JobStatus.QUEUED,
    JobStatus.SCHEDULED,
    JobStatus.RUNNING,
    JobStatus.PREEMPTING,
)


def visible_jobs(principal) -> QuerySet[Job]:
    """The jobs a key may read: its org's, narrowed to its project when the key is."""
    jobs = Job.objects.select_related("hold")
    if principal.is_operator:
        return jobs
    jobs = jobs.filter(org_id=principal.org_id)
    if principal.project_id:
        jobs = jobs.filter(project_id=principal.project_id)
    return jobs


def job_for(principal, job_id) -> Job:
    """The job if the caller may see it; 404 otherwise (never 403: no existence leak)."""
    return get_object_or_404(visible_jobs(principal), pk=job_id)


def attempt_of(job: Job, number: int | None) -> Attempt | None:
    """The job's attempt of that number, or its latest when `number` is None."""
    attempts = Attempt.objects.filter(job_id=job.pk).select_related("node")
    if number is None:
        return attempts.order_by("-number").first()
    return attempts.filter(number=number).first()


def job_for_stream(job_id) -> Job:
    """The job (with its hold) for a stream that already checked who may read it."""
    return Job.objects.select_related("hold").get(pk=job_id)


def jobs_listing(principal, *, status: str | None = None, project_id=None) -> QuerySet[Job]:
    jobs = visible_jobs(principal)
    if status:
        jobs = jobs.filter(status=status)
    if project_id:
        jobs = jobs.filter(project_id=project_id)
    return jobs


def job_events(job: Job) -> QuerySet[JobEvent]:
    return JobEvent.objects.filter(job=job).order_by("at", "id")


def quarantined_fingerprints() -> QuerySet[QuarantinedFingerprint]:
    """Every quarantined params fingerprint (operators'), newest first."""
    return QuarantinedFingerprint.objects.order_by("-created_at", "fingerprint")


def quarantined(fingerprint: str) -> QuarantinedFingerprint | None:
    """The quarantined fingerprint (with its sample job), or None."""
    rows = QuarantinedFingerprint.objects.select_related("sample_job")
    return rows.filter(pk=fingerprint).first()


def submission_request_id(job_id) -> str | None:
    """The X-Request-Id of the API request that submitted the job (None if none did)."""
    value = (
        JobEvent.objects.filter(job_id=job_id, from_status="")
        .values_list("data__request_id", flat=True)
        .first()
    )
    return value if isinstance(value, str) else None


def queued_count(org_id, *, up_to: int | None = None) -> int:
    """The org's jobs waiting in the queue (what max_queued limits), counted up to
    `up_to` when given: a quota check reads at most that many index entries."""
    queued = Job.objects.filter(org_id=org_id, status=JobStatus.QUEUED)
    return (queued[:up_to] if up_to is not None else queued).count()


def outstanding_counts(org_id) -> dict[str, int]:
    """The org's unfinished jobs by status (one grouped query)."""
    rows = (
        Job.objects.filter(org_id=org_id, status__in=OUTSTANDING_STATUSES)
        .values("status")
        .annotate(n=Count("id"))
    )
    counts = dict.fromkeys(OUTSTANDING_STATUSES, 0)
    counts.update({row["status"]: row["n"] for row in rows})
    return counts


def platform_queue_depth() -> int:
    """Queued jobs across the platform (the overload signal for shedding the free tier)."""
    return Job.objects.filter(status=JobStatus.QUEUED).count()


def dedup_source(org_id, fingerprint: str) -> Job | None:
    """The org's latest successful job with this fingerprint and a stored result."""
    return (
        Job.objects.filter(org_id=org_id, fingerprint=fingerprint, status=JobStatus.SUCCEEDED)
        .exclude(result_path="")
        .order_by("-finished_at", "-id")
        .first()
    )


def webhooks_to_redeliver(*, finished_after, finished_before, limit: int) -> list:
    """Ids of terminal jobs with a completed webhook whose delivery has no recorded
    outcome (start and progress deliveries are best effort: never redelivered)."""
    outcome = JobEvent.objects.filter(
        job=OuterRef("pk"), data__webhook__in=["delivered", "gave_up", "refused"]
    )
    return list(
        Job.objects.filter(finished_at__gte=finished_after, finished_at__lt=finished_before)
        .exclude(webhook_url="")
        .filter(webhook_events__contains=[WebhookEvent.COMPLETED.value])
        .filter(~Exists(outcome))
        .values_list("id", flat=True)[:limit]
    )


def nodes_to_avoid(job_ids) -> dict:
    """{job id: {node id}} of nodes where the job's earlier attempts failed.

    The dispatcher places a retry elsewhere when it can (and on one of these nodes
    rather than not at all).
    """
    avoid: dict = {}
    rows = Attempt.objects.filter(job_id__in=list(job_ids), exit_class__in=FAILURE_CLASSES)
    for job_id, node_id in rows.values_list("job_id", "node_id"):
        avoid.setdefault(job_id, set()).add(node_id)
    return avoid
