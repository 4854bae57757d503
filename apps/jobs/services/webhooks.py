"""Webhooks: target checks (SSRF), signing, and one delivery try with its retry decision.

Scheme. The job body (what `GET /v1/jobs/{id}` answers at the time of the delivery) plus
`"event"` is POSTed as JSON for each of the job's `webhook_events` (default completed):

    completed  on its terminal status; retried with backoff, its outcome recorded as a
               JobEvent note, redelivered by a sweep when its publish was lost.
    start      each time an attempt starts running (scheduled → running): a resume after
               a preemption or a retry sends it again; the body adds `"attempt": <n>`.
    progress   when the job's progress rises while it runs, at most one a second.

start and progress are best effort: at most a couple of quick retries for start, none for
progress (a later one supersedes it), no note in the job's log, no sweep; and they never
hold up the job (queued after its commit, never raising). Deliveries of different events
are separate task messages and may arrive out of order; the body's status is current.

    X-Gantry-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
    X-Gantry-Event:     job.<status> (completed), job.start, job.progress
    X-Gantry-Delivery:  <job id>.<status>, <job id>.start.<attempt>,
                        <job id>.progress.<progress>  (the same on every retry and
                        duplicate: deduplicate on it)

The secret is per org, derived from settings.GANTRY_WEBHOOK_SIGNING_KEY (an org reads
it at `GET /v1/webhooks/secret`; changing the master key rotates every org's secret).
A receiver recomputes the HMAC over the raw body bytes, compares in constant time and
refuses a `t` older than a few minutes (replay protection); see verify_signature().

Targets must be https (http only with GANTRY_WEBHOOK_ALLOW_HTTP) and every address the
host resolves to must be globally routable: loopback, private, link-local (which holds
the cloud metadata address), CGNAT, multicast and reserved ranges are refused at
submission and again at each delivery, unless the host is named in
GANTRY_WEBHOOK_ALLOWED_HOSTS. An IPv6 address that carries an IPv4 address (mapped,
compatible, NAT64, 6to4, Teredo) passes only if that IPv4 address passes too. A delivery
connects to the address it checked (no second DNS lookup to rebind), never follows
redirects, and is bounded by GANTRY_WEBHOOK_TIMEOUT_S so a slow endpoint cannot hold a
worker for long.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import random
import socket
import ssl
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from urllib.parse import urlsplit

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core.errors import GantryError
from apps.core.redis import redis_client
from apps.jobs import selectors
from apps.jobs.models import Job, JobStatus, WebhookEvent
from apps.jobs.serializers import job_body
from apps.jobs.services.lifecycle import record_event

logger = logging.getLogger(__name__)

DELIVER_TASK = "gantry.jobs.deliver_webhook"
EVENT_TASK = "gantry.jobs.deliver_webhook_event"

# Best-effort events (start, progress). Tries in all: start gets two quick retries (1 s,
# then 2 s later); a failed progress is not retried, the next one carries newer news.
EVENT_TRIES = {WebhookEvent.START: 3, WebhookEvent.PROGRESS: 1}
EVENT_RETRY_STEP_S = 1.0
# They share the control queue with the dispatch tick: a slow endpoint may hold a worker
# this long at most (the completed delivery keeps GANTRY_WEBHOOK_TIMEOUT_S)...
EVENT_TIMEOUT_S = 3.0
# ...and a message that waited longer than this is stale and dropped by the worker.
EVENT_EXPIRES_S = {WebhookEvent.START: 300, WebhookEvent.PROGRESS: 10}
# Progress: at most one delivery a second per job, the slot taken at delivery so that
# queue lag cannot bunch two together. Publishes are capped too (a burst of heartbeats
# costs the queue little), at twice a second: a cap of once a second would run in step
# with the delivery slot and could find it still taken every other second.
PROGRESS_INTERVAL_MS = 1000
PROGRESS_PUBLISH_INTERVAL_MS = 500

SIGNATURE_HEADER = "X-Gantry-Signature"
SIGNATURE_TOLERANCE_S = 300
USER_AGENT = "Gantry-Webhooks/1"


class UnsafeWebhookTarget(GantryError):
    code = "invalid"


@dataclass(frozen=True)
class WebhookTarget:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked address the delivery connects to


def webhook_secret(org_id) -> str:
    """The org's webhook signing secret (derived, so nothing secret is stored per org)."""
    digest = hmac.new(
        settings.GANTRY_WEBHOOK_SIGNING_KEY.encode(),
        f"gantry-webhook-secret:{org_id}".encode(),
        hashlib.sha256,
    ).hexdigest()
    return f"whsec_{digest}"


def sign(secret: str, body: bytes, *, timestamp: int) -> str:
    """The X-Gantry-Signature value for `body` sent at `timestamp` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_signature(
    secret: str, body: bytes, header: str, *, tolerance_s: int = SIGNATURE_TOLERANCE_S
) -> bool:
    """What a receiver does: check the HMAC over the raw body and that `t` is recent."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, timestamp=timestamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)


# RFC 6052 layouts of an IPv4 address inside a NAT64 prefix of each length: (start bit,
# bit count) pieces; bits 64-71 (the "u" octet) are always skipped.
_RFC6052_LAYOUTS = {
    48: ((48, 16), (72, 16)),
    56: ((56, 8), (72, 24)),
    64: ((72, 32),),
    96: ((96, 32),),
}
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")


def _rfc6052_ipv4(value: int, prefix_length: int) -> ipaddress.IPv4Address:
    embedded = 0
    for start, count in _RFC6052_LAYOUTS[prefix_length]:
        piece = (value >> (128 - start - count)) & ((1 << count) - 1)
        embedded = (embedded << count) | piece
    return ipaddress.IPv4Address(embedded)


def destination_addresses(
    address: str,
) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
    """Every address a connection to `address` may end up reaching, for the public check.

    Guarantee: an IPv6 address that carries an IPv4 address (IPv4-mapped ::ffff:a.b.c.d,
    IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::/96 and the local-use 64:ff9b:1::/48,
    6to4 2002::/16, Teredo 2001::/32 server and client) yields that IPv4 address, and
    for the local-use NAT64 prefix the IPv4 at each RFC 6052 position, since its length
    is the operator's choice. The IPv6 address itself is kept (scope id included) except
    for the IPv4-mapped and NAT64 well-known forms, which are only spellings of their
    IPv4 destination. So `address` is safe to connect to when every returned address is
    public; an IPv4 address or plain IPv6 address yields just itself.
    """
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        return (ip,)
    value = int(ip)
    embedded: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        embedded.append(ip.ipv4_mapped)
    elif value >> 32 == 0:  # IPv4-compatible: deprecated, still routed by some stacks
        embedded.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    if ip in _NAT64_WELL_KNOWN:
        embedded.append(_rfc6052_ipv4(value, 96))
    if ip in _NAT64_LOCAL_USE:
        embedded.extend(_rfc6052_ipv4(value, length) for length in _RFC6052_LAYOUTS)
    if ip.sixtofour is not None:
        embedded.append(ip.sixtofour)
    if ip.teredo is not None:
        embedded.extend(ip.teredo)  # (server, client): packets may go to either
    # Mapped and well-known NAT64 addresses only spell their IPv4 destination (a dual-stack
    # socket sends IPv4; IANA lists 64:ff9b::/96 as global, the stdlib flags both reserved
    # as part of ::/8), so the IPv6 form is judged only when a zone index is attached.
    spelling_only = (ip.ipv4_mapped is not None or ip in _NAT64_WELL_KNOWN) and not ip.scope_id
    return tuple(dict.fromkeys(embedded if spelling_only else [ip, *embedded]))


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    # A zone index ties an address to one local link (fe80::1%eth0); site-local fec0::/10
    # is deprecated but still internal, and is_global says True for it.
    if ip.version == 6 and (ip.scope_id or ip.is_site_local):
        return False
    # is_global is False for loopback, RFC 1918, link-local (169.254.169.254 metadata),
    # CGNAT 100.64/10, unique-local fc00::/7, documentation and most reserved ranges.
    return ip.is_global and not (ip.is_multicast or ip.is_unspecified or ip.is_reserved)


def _address_is_public(address: str) -> bool:
    """True only when every address a connection to `address` may reach is public."""
    return all(_is_public(ip) for ip in destination_addresses(address))


def check_target(url: str) -> WebhookTarget:
    """Parse and vet a webhook URL; raise UnsafeWebhookTarget (400, field webhook_url)."""

    def refuse(message: str):
        raise UnsafeWebhookTarget(f"webhook_url: {message}", field="webhook_url")

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        refuse("not a valid URL.")
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        refuse("must be an https URL.")
    if scheme == "http" and not settings.GANTRY_WEBHOOK_ALLOW_HTTP:
        refuse("must be https (plain http is not allowed here).")
    host = (parts.hostname or "").lower()
    if not host:
        refuse("has no host.")
    if parts.username or parts.password:
        refuse("must not carry credentials.")
    port = port or (443 if scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        refuse(f"host {host!r} does not resolve.")
    # getaddrinfo moves a zone index ("%eth0") out of the address into the sockaddr's
    # scope id; put it back so the check sees it.
    addresses = list(
        dict.fromkeys(
            f"{info[4][0]}%{info[4][3]}" if len(info[4]) == 4 and info[4][3] else info[4][0]
            for info in infos
        )
    )
    if not addresses:
        refuse(f"host {host!r} does not resolve.")
    if host not in {h.lower() for h in settings.GANTRY_WEBHOOK_ALLOWED_HOSTS}:
        blocked = [a for a in addresses if not _address_is_public(a)]
        if blocked:
            refuse(f"host {host!r} resolves to a non-public address ({blocked[0]}).")
    return WebhookTarget(scheme=scheme, host=host, port=port, path=path, address=addresses[0])


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the address that was checked, not to a fresh DNS answer."""

    def __init__(self, target: WebhookTarget, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, target: WebhookTarget, timeout: float):
        super().__init__(
            target.host, target.port, timeout=timeout, context=ssl.create_default_context()
        )
        self._address = target.address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        # Certificate and SNI are checked against the host name, not the address.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post_signed(
    target: WebhookTarget,
    *,
    body: bytes,
    secret: str,
    headers: dict,
    timeout_s: float | None = None,
) -> int:
    """POST once to the pinned address; the HTTP status, or raise OSError on failure.
    Bounded by `timeout_s` (default GANTRY_WEBHOOK_TIMEOUT_S)."""
    timeout = settings.GANTRY_WEBHOOK_TIMEOUT_S if timeout_s is None else timeout_s
    conn_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    conn = conn_class(target, timeout)
    deadline = time.monotonic() + timeout
    try:
        conn.request(
            "POST",
            target.path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                SIGNATURE_HEADER: sign(secret, body, timestamp=int(time.time())),
                **headers,
            },
        )
        response = conn.getresponse()
        # Read a bounded amount: a drip-feeding endpoint is cut off by the deadline.
        while time.monotonic() < deadline and response.read(8192):
            pass
        return response.status
    except (http.client.HTTPException, ssl.SSLError) as exc:
        raise OSError(f"{exc.__class__.__name__}: {exc}") from exc
    finally:
        conn.close()


def backoff_s(tries_done: int) -> float:
    """Exponential backoff with jitter after `tries_done` failed tries (1 → base)."""
    base = settings.GANTRY_WEBHOOK_BACKOFF_BASE_S
    delay = min(settings.GANTRY_WEBHOOK_BACKOFF_MAX_S, base * 2 ** max(0, tries_done - 1))
    return delay * random.uniform(0.8, 1.2)


@dataclass(frozen=True)
class DeliveryOutcome:
    """`retry_in` is set when the caller should try again after that many seconds."""

    delivered: bool
    retry_in: float | None
    detail: str


def deliver_job_webhook(job_id, *, try_number: int) -> DeliveryOutcome:
    """Make delivery try `try_number` (1-based) of the job's terminal webhook.

    Only for a job whose webhook_events include completed; the body carries
    `"event": "completed"`. Guarantee: at most one recorded outcome per job (delivered,
    gave_up or refused, a JobEvent note), so running this again after success sends
    nothing. The target is
    re-checked (SSRF) before every try; a refused target is not retried. A failure
    (connection error, timeout, non-2xx) asks for a retry after exponential backoff
    until GANTRY_WEBHOOK_MAX_TRIES, then gives up.
    """
    job = Job.objects.select_related("hold").filter(pk=job_id).first()
    if (
        job is None
        or not job.webhook_url
        or not job.is_terminal
        or WebhookEvent.COMPLETED not in job.webhook_events
    ):
        return DeliveryOutcome(delivered=False, retry_in=None, detail="nothing to deliver")
    if job.events.filter(data__webhook__in=["delivered", "gave_up", "refused"]).exists():
        return DeliveryOutcome(delivered=False, retry_in=None, detail="already settled")
    host = urlsplit(job.webhook_url).hostname or ""
    try:
        target = check_target(job.webhook_url)
    except UnsafeWebhookTarget as exc:
        record_event(
            job,
            reason=f"webhook refused at delivery: {exc.message}",
            actor="webhooks",
            data={"webhook": "refused", "tries": try_number},
        )
        return DeliveryOutcome(delivered=False, retry_in=None, detail=exc.message)
    ok, detail = _post_event(
        job,
        target,
        event=WebhookEvent.COMPLETED,
        headers={
            "X-Gantry-Event": f"job.{job.status}",
            "X-Gantry-Delivery": f"{job.id}.{job.status}",
        },
    )
    if ok:
        record_event(
            job,
            reason=f"webhook delivered to {host} ({detail}) on try {try_number}",
            actor="webhooks",
            data={"webhook": "delivered", "tries": try_number, "status": detail},
        )
        return DeliveryOutcome(delivered=True, retry_in=None, detail=detail)
    logger.info(
        "webhook try %s to %s failed: %s", try_number, host, detail, extra={"job_id": job.id}
    )
    if try_number >= settings.GANTRY_WEBHOOK_MAX_TRIES:
        record_event(
            job,
            reason=f"webhook to {host} gave up after {try_number} tries ({detail})",
            actor="webhooks",
            data={"webhook": "gave_up", "tries": try_number, "status": detail},
        )
        return DeliveryOutcome(delivered=False, retry_in=None, detail=detail)
    return DeliveryOutcome(delivered=False, retry_in=backoff_s(try_number), detail=detail)


def _post_event(
    job: Job,
    target: WebhookTarget,
    *,
    event: str,
    headers: dict,
    extra: dict | None = None,
    timeout_s: float | None = None,
) -> tuple[bool, str]:
    """POST the job body with its `event` (and `extra` fields) once: (2xx?, detail)."""
    document = {**job_body(job), "event": str(event), **(extra or {})}
    body = json.dumps(document, separators=(",", ":")).encode()
    try:
        status = post_signed(
            target,
            body=body,
            secret=webhook_secret(job.org_id),
            headers=headers,
            timeout_s=timeout_s,
        )
    except OSError as exc:
        return False, f"{exc.__class__.__name__}: {exc}"
    return 200 <= status < 300, f"HTTP {status}"


def notify(job: Job, *, event: str, attempt: int | None = None) -> None:
    """Queue the job's `event` webhook for when the current transaction commits, if the
    job asked for that event (its webhook_url and webhook_events; `job` must carry both).

    Guarantee: adds nothing to the caller's transaction (no query, no Redis, no broker
    before the commit) and never raises after it: a claim, a heartbeat or a job's end
    is never slowed or failed by a webhook. Nothing is queued if the transaction rolls
    back. completed goes through enqueue_delivery (retries, the redelivery sweep);
    start (with the `attempt` number that started) and progress through enqueue_event.
    """
    event = WebhookEvent(event).value  # a wrong name fails here, not after the commit
    if not job.webhook_url or event not in job.webhook_events:
        return
    if event == WebhookEvent.COMPLETED:
        transaction.on_commit(partial(enqueue_delivery, job.id))
    else:
        transaction.on_commit(partial(enqueue_event, job.id, event=event, attempt=attempt))


def _take_slot(key: str, *, interval_ms: int) -> bool:
    """True for the first caller in `interval_ms` for this key (SET NX PX)."""
    return bool(redis_client().set(key, 1, nx=True, px=interval_ms))


def enqueue_event(job_id, *, event: str, attempt: int | None = None) -> None:
    """Publish a best-effort start or progress delivery now (call from on_commit).

    Never raises: a publish lost to a broker or Redis outage is dropped (best effort).
    Progress is published at most twice a second per job; the rises in between are
    dropped, since the next published one (or the completed delivery) carries them.
    """
    try:
        event = WebhookEvent(event).value
        if event == WebhookEvent.PROGRESS and not _take_slot(
            f"gantry:webhook:progress:queued:{job_id}", interval_ms=PROGRESS_PUBLISH_INTERVAL_MS
        ):
            return
        current_app.send_task(
            EVENT_TASK,
            args=[str(job_id), event, attempt],
            queue="control",
            expires=EVENT_EXPIRES_S[event],
        )
    except Exception as exc:  # broker or Redis down: best effort, nothing to redeliver
        logger.warning("webhook %s not queued: %s", event, exc, extra={"job_id": job_id})


def deliver_job_event(
    job_id, *, event: str, attempt: int | None = None, try_number: int = 1
) -> DeliveryOutcome:
    """Make try `try_number` (1-based) of a best-effort `start` or `progress` delivery.

    Guarantee: nothing is written to the job or its log (the completed delivery's notes
    stay the only webhook outcomes), and each try POSTs at most once even when its task
    runs twice (a Redis key per try for start; for progress the per-second slot below).
    start (of attempt number `attempt`) is sent even if the job has moved on since (the
    body says where it is now) and asks for a retry after 1 s, then 2 s, on failure.
    progress is sent only while the job still runs (an ended job has its completed
    delivery), at most once a second per job (SET NX PX 1000 taken before the POST,
    whatever the outcome), and never retried. The target is re-checked (SSRF) before
    every try; a refused one is not retried. Each try is bounded by EVENT_TIMEOUT_S.
    """
    event = WebhookEvent(event).value
    if event == WebhookEvent.COMPLETED:
        raise ValueError("completed is delivered by deliver_job_webhook")
    job = Job.objects.select_related("hold").filter(pk=job_id).first()
    if job is None or not job.webhook_url or event not in job.webhook_events:
        return DeliveryOutcome(delivered=False, retry_in=None, detail="nothing to deliver")
    if event == WebhookEvent.PROGRESS:
        if job.status not in (JobStatus.RUNNING, JobStatus.PREEMPTING):
            return DeliveryOutcome(delivered=False, retry_in=None, detail="no longer running")
        if not _take_slot(
            f"gantry:webhook:progress:sent:{job.id}", interval_ms=PROGRESS_INTERVAL_MS
        ):
            return DeliveryOutcome(delivered=False, retry_in=None, detail="throttled")
        delivery, extra = f"{job.id}.progress.{job.progress}", {}
    else:
        once = f"gantry:webhook:start:{job.id}:{attempt}:{try_number}"
        if not redis_client().set(once, 1, nx=True, ex=24 * 3600):
            return DeliveryOutcome(delivered=False, retry_in=None, detail="already tried")
        delivery, extra = f"{job.id}.start.{attempt}", {"attempt": attempt}
    host = urlsplit(job.webhook_url).hostname or ""
    try:
        target = check_target(job.webhook_url)
    except UnsafeWebhookTarget as exc:
        logger.info(
            "webhook %s refused at delivery: %s", event, exc.message, extra={"job_id": job.id}
        )
        return DeliveryOutcome(delivered=False, retry_in=None, detail=exc.message)
    ok, detail = _post_event(
        job,
        target,
        event=event,
        headers={"X-Gantry-Event": f"job.{event}", "X-Gantry-Delivery": delivery},
        extra=extra,
        timeout_s=min(EVENT_TIMEOUT_S, settings.GANTRY_WEBHOOK_TIMEOUT_S),
    )
    if ok:
        return DeliveryOutcome(delivered=True, retry_in=None, detail=detail)
    logger.info(
        "webhook %s try %s to %s failed: %s",
        event,
        try_number,
        host,
        detail,
        extra={"job_id": job.id},
    )
    if try_number >= EVENT_TRIES[event]:
        return DeliveryOutcome(delivered=False, retry_in=None, detail=detail)
    return DeliveryOutcome(delivered=False, retry_in=EVENT_RETRY_STEP_S * try_number, detail=detail)


def enqueue_delivery(job_id) -> None:
    """Publish the delivery task now (call from on_commit). Never raises: a lost publish
    is picked up by the periodic redelivery sweep."""
    try:
        # By name: the task module (apps/jobs/tasks.py) calls this one, not the reverse.
        current_app.send_task(DELIVER_TASK, args=[str(job_id)], queue="control")
    except Exception as exc:  # broker down: the sweep redelivers later
        logger.warning("webhook delivery not queued: %s", exc, extra={"job_id": job_id})


def redeliver_stranded(*, limit: int = 500) -> int:
    """Queue deliveries for terminal jobs whose webhook has no outcome after a long time.

    Covers a publish lost while the broker was down. Only jobs finished longer ago than
    the whole retry schedule are considered, so this never overlaps live retries.
    """
    span = sum(
        min(
            settings.GANTRY_WEBHOOK_BACKOFF_MAX_S,
            settings.GANTRY_WEBHOOK_BACKOFF_BASE_S * 2**i,
        )
        * 1.2
        + settings.GANTRY_WEBHOOK_TIMEOUT_S
        for i in range(settings.GANTRY_WEBHOOK_MAX_TRIES)
    )
    now = timezone.now()
    job_ids = selectors.webhooks_to_redeliver(
        finished_after=now - timedelta(days=1),
        finished_before=now - timedelta(seconds=span + 600),
        limit=limit,
    )
    client = redis_client()
    queued = 0
    for job_id in job_ids:
        # One sweep-started delivery chain per job at a time.
        if client.set(f"gantry:webhook:swept:{job_id}", 1, nx=True, ex=int(span) + 600):
            enqueue_delivery(job_id)
            queued += 1
    return queued
