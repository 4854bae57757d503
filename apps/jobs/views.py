"""Job endpoints: submit, read, list, events, cancel, result; signed downloads; and the
operators' job actions (cancel any org's job, requeue a dead-lettered one, lift a
quarantine), which go through apps.jobs.operations and are recorded in the audit trail
(actor `api:<key prefix>`) in the change's transaction; a refused call records nothing."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import (
    FileResponse,
    Http404,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from apps.accounts.authentication import APIKeyAuthentication
from apps.accounts.models import Project
from apps.accounts.operator_actions import api_operator
from apps.accounts.permissions import IsOperator
from apps.core.errors import GantryError, problem
from apps.core.idempotency import idempotency_key_of, idempotent
from apps.core.pagination import OpaqueCursorPagination
from apps.core.schema import also_answers, idempotency_parameter, plain_operation
from apps.core.serializers import check_json_types
from apps.core.views import APIView, GenericAPIView
from apps.jobs import operations, queue_state, selectors, streams
from apps.jobs.models import JobStatus
from apps.jobs.serializers import (
    JOB_EXAMPLE,
    JobEventSerializer,
    JobListFilterSerializer,
    JobSerializer,
    JobSubmitSerializer,
    QuarantinedFingerprintSerializer,
    WebhookSecretSerializer,
    job_body,
)
from apps.jobs.services import results, submission, webhooks
from apps.jobs.services.cancel import cancel_job
from apps.jobs.services.logs import current_log_text
from apps.jobs.services.params_schema import generator_params_schema
from apps.jobs.streams import log_events

IDEMPOTENCY_PARAMETER = idempotency_parameter(
    required=True,
    description="The same key and body replay the first answer (the same job, "
    "`Idempotent-Replayed: true`) and never hold credits twice; the same key with another "
    "body is a 409. Scoped to the org (to the project, for a project key).",
)
# The stand-in generator's params schema, as the example of GET /v1/generator/schema.
STANDIN_PARAMS_SCHEMA = json.loads(
    (Path(__file__).parent / "standin_generator.params.schema.json").read_text(encoding="utf-8")
)


class EventCursorPagination(OpaqueCursorPagination):
    ordering = ("at", "id")
    page_size = 500


class QuarantinePagination(OpaqueCursorPagination):
    ordering = ("-created_at", "fingerprint")


def _org_principal(request):
    if request.user.is_operator:
        raise PermissionDenied("Jobs are submitted and followed with an org key.")
    return request.user


class JobListView(GenericAPIView):
    serializer_class = JobSerializer
    pagination_class = OpaqueCursorPagination

    @extend_schema(
        operation_id="jobs_list",
        summary="List jobs",
        description="The org's jobs (a project key: its project's), newest first.",
        responses={200: JobSerializer(many=True)},
        parameters=[
            OpenApiParameter("status", OpenApiTypes.STR, enum=JobStatus.values),
            OpenApiParameter(
                "project",
                OpenApiTypes.STR,
                description="Project id or name (operators: its id); one the org does not "
                "have is a 400.",
            ),
        ],
    )
    def get(self, request):
        filters = JobListFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        project_id = None
        if filters.validated_data.get("project"):
            project_id = _project_filter(request.user, filters.validated_data["project"])
        jobs = selectors.jobs_listing(
            request.user, status=filters.validated_data.get("status"), project_id=project_id
        )
        page = self.paginate_queryset(jobs)
        states = queue_state.read_for(job for job in page if job.status == JobStatus.QUEUED)
        return self.get_paginated_response([job_body(job, queue_states=states) for job in page])

    @also_answers(402, 403, 409, 422, 429)
    @extend_schema(
        operation_id="jobs_submit",
        summary="Submit a job (org key)",
        description="Answers 202 with the queued job, its credit hold taken (enough for "
        "`max_runtime_s` × `gpu_count` on the priciest GPU type it allows). `params` is "
        "checked against the generator's JSON Schema first (a 400 naming the path, "
        "`params.steps`). 402: not enough credits; 403: a hard budget would be exceeded, "
        "another project than a project key's, or an operator key; 409: the "
        "Idempotency-Key was used with another body; 422: the spec is quarantined; 429: "
        "rate limited, the free tier shed, or the org's queue is full (Retry-After).",
        request=JobSubmitSerializer,
        parameters=[IDEMPOTENCY_PARAMETER],
        responses={202: JobSerializer},
    )
    def post(self, request):
        principal = _org_principal(request)
        key = idempotency_key_of(request, required=True)
        # JSON types as the schema declares them ("600" is not an integer); the service
        # checks everything else (apps.jobs.validation).
        check_json_types(JobSubmitSerializer, request.data)
        result = submission.submit_api_request(
            api_key=principal.api_key, body=request.data, idempotency_key=key
        )
        # A job queued by this request has no queue state yet (no dispatcher round has
        # seen it): no Redis read for it; a replayed one may have one.
        states = None if result.replayed else {}
        response = Response(
            job_body(result.job, queue_states=states), status=status.HTTP_202_ACCEPTED
        )
        if result.replayed:
            response["Idempotent-Replayed"] = "true"
        return response


def _project_filter(principal, ref: str):
    """A list filter's project (id or name) as an id; unknown: 400 naming `project`."""
    projects = Project.objects.order_by("pk")
    if not principal.is_operator:
        projects = projects.filter(org_id=principal.org_id)
    try:
        found = projects.filter(pk=uuid.UUID(ref)).values_list("id", flat=True).first()
    except ValueError:
        found = None
    if found is None and not principal.is_operator:
        found = projects.filter(name=ref).values_list("id", flat=True).first()
    if found is None:
        raise GantryError(f"project: no project {ref!r}.", code="invalid", field="project")
    return found


class JobDetailView(GenericAPIView):
    serializer_class = JobSerializer

    @extend_schema(operation_id="jobs_retrieve", summary="Read a job")
    def get(self, request, job_id):
        return Response(job_body(selectors.job_for(request.user, job_id)))


class JobEventsView(GenericAPIView):
    serializer_class = JobEventSerializer
    pagination_class = EventCursorPagination

    @extend_schema(
        operation_id="jobs_events_list",
        summary="A job's status changes",
        description="Oldest first. A tenant reads the public reason (never another "
        "tenant's job, org or a scheduler score); operators read the whole reason.",
        responses={200: JobEventSerializer(many=True)},
    )
    def get(self, request, job_id):
        job = selectors.job_for(request.user, job_id)
        page = self.paginate_queryset(selectors.job_events(job))
        context = {"operator": request.user.is_operator}  # tenants read the public wording
        return self.get_paginated_response(
            JobEventSerializer(page, many=True, context=context).data
        )


class JobCancelView(GenericAPIView):
    serializer_class = JobSerializer

    @also_answers(409)
    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        description="Answers the job as it now is; a running job is stopped and charged for "
        "the time it ran. A finished job: 409 (`field`: status). An org key cancels its "
        "own jobs; an operator key any org's, recorded in the audit trail as job.cancel.",
        request=None,
        parameters=[idempotency_parameter()],
        responses={200: JobSerializer},
    )
    @idempotent()
    def post(self, request, job_id):
        job = selectors.job_for(request.user, job_id)
        if request.user.is_operator:
            job = operations.cancel(
                job.id, **api_operator(request), org_id=job.org_id, status=job.status
            )
        else:
            job = cancel_job(job.id, actor=f"api:{request.user.api_key.prefix}")
        return Response(job_body(job))


class JobRequeueView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = JobSerializer

    @also_answers(402, 409, 422)
    @extend_schema(
        operation_id="jobs_requeue",
        summary="Requeue a dead-lettered job as a new job (operator)",
        description="A failed job stays failed; it is run again as a NEW job (same org, "
        "project, user and spec, a fresh hold), answered with 201. Requeuing it again "
        "answers 201 with the same copy and changes nothing (recorded once, as "
        "job.requeue). A job that is not failed: 409 (`field`: status). The copy needs the "
        "org's credits (402), fits its hard budgets (403) and is not quarantined (422); "
        "quotas do not apply.",
        request=None,
        responses={201: JobSerializer},
    )
    def post(self, request, job_id):
        job = selectors.job_for(request.user, job_id)
        copy = operations.requeue(
            job.id, **api_operator(request), org_id=job.org_id, status=job.status
        )
        return Response(job_body(copy), status=status.HTTP_201_CREATED)


class QuarantineListView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = QuarantinedFingerprintSerializer
    pagination_class = QuarantinePagination

    @extend_schema(
        operation_id="quarantine_list",
        summary="List quarantined params fingerprints (operator)",
        description="Newest first. A submission with one of these fingerprints is a 422.",
        responses={200: QuarantinedFingerprintSerializer(many=True)},
    )
    def get(self, request):
        page = self.paginate_queryset(selectors.quarantined_fingerprints())
        return self.get_paginated_response(QuarantinedFingerprintSerializer(page, many=True).data)


class QuarantineDetailView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = QuarantinedFingerprintSerializer

    @extend_schema(
        operation_id="quarantine_clear",
        summary="Lift a quarantine (operator)",
        description="Jobs with these params may be submitted again (one more hang or crash "
        "quarantines them again). Recorded as quarantine.clear. 404 when the fingerprint "
        "is not quarantined.",
        parameters=[
            OpenApiParameter(
                "fingerprint",
                {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                OpenApiParameter.PATH,
                description="sha256 hex of the canonical params + resources.",
            )
        ],
        responses={204: None},
    )
    def delete(self, request, fingerprint):
        row = selectors.quarantined(fingerprint)
        if row is None or not operations.clear_quarantine(row, **api_operator(request)):
            raise GantryError(
                "This fingerprint is not quarantined.", code="not_found", status_code=404
            )
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobResultView(GenericAPIView):
    serializer_class = JobSerializer

    @extend_schema(
        operation_id="jobs_result",
        summary="Download a job's output",
        description="302 to a signed link of the output file, valid GANTRY_RESULT_URL_TTL_S; "
        "404 while the job has no result, or when it is no longer stored.",
        parameters=[
            OpenApiParameter(
                "Location",
                OpenApiTypes.URI,
                OpenApiParameter.HEADER,
                required=True,
                response=[302],
                description="The signed, expiring link (GET /v1/results/{token}).",
            )
        ],
        responses={
            302: OpenApiResponse(
                description="To a signed, expiring URL of the output file.",
            )
        },
    )
    def get(self, request, job_id):
        job = selectors.job_for(request.user, job_id)
        link = results.signed_result_link(job)  # 404 while there is none
        if not results.storage().exists(job.result_path):  # deleted, or lost by the store
            raise results.NoResult("This job's result is no longer stored.")
        return HttpResponseRedirect(link.url)


class ResultDownloadView(GenericAPIView):
    """The signed link itself: no API key; the signature and its expiry are the access."""

    authentication_classes = []
    permission_classes = [AllowAny]

    @also_answers(403, 410)
    @extend_schema(
        operation_id="results_download",
        summary="The output file, by its signed link",
        description="No API key: the signature and its expiry are the access. 403: an "
        "altered link; 410: expired, or the result is gone. With object storage, a 302 to "
        "the store's own short-lived URL.",
        responses={
            (200, "*/*"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The file, as an attachment (Content-Type from its name, "
                "e.g. image/png).",
                examples=[OpenApiExample("A PNG", value="<the PNG file's bytes>")],
            ),
            302: OpenApiResponse(description="To the object store's short-lived URL."),
        },
    )
    def get(self, request, token):
        download = results.open_result_link(token)
        store = results.storage()
        if not store.exists(download.key):  # a store's URL would only say 404 later
            raise results.ResultLinkExpired("This result is no longer available.")
        direct = store.direct_url(
            download.key, expires_in=min(download.expires_in, 300), filename=download.filename
        )
        if direct:
            return HttpResponseRedirect(direct)
        try:
            handle = store.open(download.key)
        except FileNotFoundError as exc:
            raise results.ResultLinkExpired("This result is no longer available.") from exc
        return FileResponse(
            handle,
            as_attachment=True,
            filename=download.filename,
            content_type=results.content_type_of(download.filename),
        )


class WebhookSecretView(GenericAPIView):
    serializer_class = WebhookSecretSerializer

    @also_answers(403)
    @extend_schema(
        operation_id="webhooks_secret",
        summary="The org's webhook signing secret (org key)",
        description="Deliveries carry X-Gantry-Signature, an HMAC-SHA256 with this secret.",
    )
    def get(self, request):
        principal = _org_principal(request)
        return Response(
            {
                "secret": webhooks.webhook_secret(principal.org_id),
                "signature_header": webhooks.SIGNATURE_HEADER,
                "scheme": 't=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>',
            }
        )


class GeneratorSchemaView(APIView):
    """The JSON Schema that a job's `params` must satisfy (the generator's own)."""

    @also_answers(404)
    @extend_schema(
        operation_id="generator_schema",
        summary="The JSON Schema of a job's params",
        description="The generator's own (GANTRY_GENERATOR_PARAMS_SCHEMA; the stand-in's by "
        "default); a submission's `params` must satisfy it. 404 when the generator "
        "publishes none.",
        responses={
            200: OpenApiResponse(
                {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "A JSON Schema (draft 2020-12).",
                },
                description="A JSON Schema (draft 2020-12).",
                examples=[OpenApiExample("The stand-in's", value=STANDIN_PARAMS_SCHEMA)],
            )
        },
    )
    def get(self, request):
        return Response(generator_params_schema())


# The blocking reads of streams (key, job, log) run on these threads, shared by every
# event loop of the process: their database connections are reused (CONN_MAX_AGE) and
# bounded, instead of following the life of a loop's default executor.
STREAM_READ_THREADS = 4
STREAM_READS = ThreadPoolExecutor(
    max_workers=STREAM_READ_THREADS, thread_name_prefix="stream-reads"
)


def stream_read(fn):
    """`fn` as a coroutine function run on STREAM_READS, closing its thread's database
    connection afterwards where it should not persist (CONN_MAX_AGE, or an error)."""

    def read(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(read, thread_sensitive=False, executor=STREAM_READS)


def _stream_principal_and_job(request, job_id):
    """Authenticate as the API does and find the job the key may read (blocking)."""
    try:
        principal, _ = APIKeyAuthentication().authenticate(request) or (None, None)
    except AuthenticationFailed as exc:
        return _problem("unauthenticated", str(exc.detail), 401), None
    if principal is None:
        return _problem(
            "unauthenticated", "Authentication credentials were not provided.", 401
        ), None
    try:
        job = selectors.job_for(principal, job_id)
    except Http404:
        return _problem("not_found", "Not found.", 404), None
    return None, job


def _problem(
    code: str, message: str, status_code: int, *, field: str | None = None
) -> JsonResponse:
    return JsonResponse(
        problem(code, message, status_code=status_code, field=field), status=status_code
    )


def _method_not_allowed(request) -> JsonResponse:
    response = _problem("method_not_allowed", f'Method "{request.method}" not allowed.', 405)
    response["Allow"] = "GET"
    return response


# The OpenAPI operations of the two async views (drf-spectacular sees DRF views only;
# apps.core.schema.add_plain_views adds these).
JOB_ID_PARAMETER = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}
_JOB_EVENT = "event: job\nid: 1\ndata: " + json.dumps(JOB_EXAMPLE, separators=(",", ":")) + "\n\n"
STREAM_OPERATION = {
    "operationId": "jobs_stream",
    "summary": "Follow a job (Server-Sent Events)",
    "description": "`text/event-stream`: an `event: job` with the job body at once, then on "
    "every change of status, progress, cost or queue (within a status at most two a "
    "second), `: keep-alive` comments every 15 s; closes after a terminal status.",
    "tags": ["jobs"],
    "parameters": [JOB_ID_PARAMETER],
    "responses": {
        "200": {
            "description": "The job's events, until it ends.",
            "content": {
                "text/event-stream": {
                    # Before OpenAPI 3.2 (itemSchema), `schema` describes each event.
                    "schema": {
                        "type": "object",
                        "required": ["event", "id", "data"],
                        "properties": {
                            "event": {"type": "string", "enum": ["job"]},
                            "id": {"type": "string", "description": "1, 2, 3, ..."},
                            "data": {
                                "type": "string",
                                "description": "The job body (the Job schema), as JSON.",
                            },
                        },
                    },
                    "examples": {"AJobEvent": {"value": _JOB_EVENT}},
                }
            },
        }
    },
}
LOGS_OPERATION = {
    "operationId": "jobs_logs",
    "summary": "A job's generator output",
    "description": "`text/plain`: what the generator printed on stdout and stderr in the "
    "attempt (default the latest), in order; while it runs, its latest lines. Up to "
    "GANTRY_LOG_LIMIT_BYTES (the first and the last half of a longer log, with a line "
    "saying what was cut). With `Accept: text/event-stream`: an `event: line` per line as "
    "it is written, closing when the attempt ends. 404: no attempt yet, no such attempt, "
    "or its log is gone.",
    "tags": ["jobs"],
    "parameters": [
        JOB_ID_PARAMETER,
        {
            "name": "attempt",
            "in": "query",
            "required": False,
            "description": "The attempt's number (1 is the first); default the latest.",
            "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        },
    ],
    "responses": {
        "200": {
            "description": "The attempt's log.",
            "content": {
                "text/plain": {
                    "schema": {"type": "string"},
                    "examples": {"ALog": {"value": "step 1/20\nPROGRESS 0.05\n"}},
                },
                "text/event-stream": {
                    # Before OpenAPI 3.2 (itemSchema), `schema` describes each event.
                    "schema": {
                        "type": "object",
                        "required": ["event", "data"],
                        "properties": {
                            "event": {"type": "string", "enum": ["line"]},
                            "data": {"type": "string", "description": "One line of output."},
                        },
                    },
                    "examples": {"Lines": {"value": "event: line\ndata: step 1/20\n\n"}},
                },
            },
        }
    },
}


@plain_operation("get", STREAM_OPERATION)
async def job_stream(request, job_id):
    """GET /v1/jobs/{id}/stream: Server-Sent Events of the job body (apps/jobs/streams.py).

    Served by Django's async handler (config/asgi.py), so an open stream holds no thread."""
    if request.method != "GET":
        return _method_not_allowed(request)
    run_sync = stream_read
    refusal, job = await run_sync(_stream_principal_and_job)(request, job_id)
    if refusal is not None:
        return refusal

    def read_body() -> dict:
        return job_body(selectors.job_for_stream(job.pk))

    async def call(fn):
        return await run_sync(fn)()

    events = streams.job_events(job.pk, read_body=read_body, run_sync=call)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response


@plain_operation("get", LOGS_OPERATION)
async def job_logs(request, job_id):
    """GET /v1/jobs/{id}/logs?attempt=N: the generator's output of an attempt (default:
    the latest), as text/plain; with `Accept: text/event-stream`, `event: line` per line
    as the generator writes it, closing when the attempt ends (apps/jobs/services/logs.py).
    """
    if request.method != "GET":
        return _method_not_allowed(request)
    run_sync = stream_read
    refusal, job = await run_sync(_stream_principal_and_job)(request, job_id)
    if refusal is not None:
        return refusal
    wanted = request.GET.get("attempt")
    if wanted is not None and not (wanted.isdigit() and 0 < int(wanted) < 2**31):
        return _problem(
            "invalid", "attempt: must be a positive attempt number.", 400, field="attempt"
        )
    attempt = await run_sync(selectors.attempt_of)(job, int(wanted) if wanted else None)
    if attempt is None:
        message = "The job has not started an attempt yet." if not wanted else "No such attempt."
        return _problem("not_found", message, 404)
    if "text/event-stream" in request.headers.get("Accept", ""):
        response = StreamingHttpResponse(
            log_events(job, attempt, run_sync=run_sync), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    text = await run_sync(current_log_text)(job, attempt)
    if text is None:
        return _problem("not_found", "This attempt's log is no longer available.", 404)
    return HttpResponse(text, content_type="text/plain; charset=utf-8")
