"""Issuing credit into buckets, and expiring what is left of them."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from apps.core.clock import db_now
from apps.core.errors import Conflict, GantryError
from apps.ledger.metrics import count
from apps.ledger.models import Account, Bucket, BucketKind, EntryKind
from apps.ledger.selectors import grant_totals
from apps.ledger.services._statements import Changes
from apps.ledger.services._transaction import LedgerTransaction, ledger_setting
from apps.ledger.services._validation import check_scope, positive_amount


def grant(
    *,
    org,
    amount: int,
    kind: str,
    project=None,
    expires_at: datetime | None = None,
    idempotency_key: str | None = None,
    actor: str = "",
) -> Bucket:
    """Issue `amount` micro-credits into a new bucket of `kind` ("paid", "promo", "grant").

    Optional project scope (only that project's holds may draw from it) and expiry,
    which must lie in the future by the database clock. With an idempotency key, the
    same key and the same grant return the first bucket and issue nothing more, even
    under concurrent calls; the same key with a different grant raises Conflict.

    A grant of at least twice GANTRY_LEDGER_LANE_MIN is issued as lanes (see
    Bucket.lane_of): up to GANTRY_LEDGER_BUCKET_LANES buckets of one rank sharing the
    amount; the returned bucket is the first lane. selectors.grant_totals adds them up.
    """
    positive_amount(amount)
    if kind not in BucketKind.values:
        raise GantryError(f"kind must be one of {BucketKind.values}.", code="invalid", field="kind")
    check_scope(org=org, project=project)
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 255):
        raise GantryError(
            "idempotency_key must have 1 to 255 characters.",
            code="invalid",
            field="idempotency_key",
        )
    request = {
        "amount": amount,
        "kind": kind,
        "project_id": getattr(project, "pk", None),
        "expires_at": expires_at,
    }
    if idempotency_key is not None:
        existing = Bucket.objects.filter(org=org, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replay(existing, request)
    try:
        with transaction.atomic():
            bucket = _issue(
                org=org,
                project=project,
                kind=kind,
                amount=amount,
                expires_at=expires_at,
                key=idempotency_key,
                actor=actor,
            )
    except IntegrityError:
        # A concurrent call with the same key committed first: answer with its bucket.
        existing = Bucket.objects.filter(org=org, idempotency_key=idempotency_key).first()
        if idempotency_key is None or existing is None:
            raise
        return _replay(existing, request)
    count("grant")
    return bucket


def _issue(*, org, project, kind, amount, expires_at, key, actor) -> Bucket:
    now = db_now()
    if expires_at is not None and expires_at <= now:
        raise GantryError("expires_at must be in the future.", code="invalid", field="expires_at")
    shares = lane_shares(amount)
    common = {
        "org": org,
        "project": project,
        "kind": kind,
        "expires_at": expires_at,
        "actor": actor[:200],
        "created_at": now,
    }
    bucket = Bucket.objects.create(granted=shares[0], idempotency_key=key, **common)
    lanes = [bucket]
    if len(shares) > 1:
        lanes += Bucket.objects.bulk_create(
            Bucket(granted=share, lane=n, lane_of=bucket, **common)
            for n, share in enumerate(shares[1:], start=1)
        )
    changes = Changes(org_id=org.pk, at=now)
    for lane in lanes:
        changes.move(
            kind=EntryKind.ISSUE,
            bucket_id=lane.pk,
            source=Account.ISSUED,
            target=Account.AVAILABLE,
            amount=lane.granted,
            idempotency_key=key or "",
            memo=f"{kind} grant{f' by {actor}' if actor else ''}"
            + (f" (lane {lane.lane + 1} of {len(lanes)})" if len(lanes) > 1 else ""),
        )
    # The new rows were created holding `granted`: the entries justify it, not change it.
    with LedgerTransaction() as tx:  # a savepoint of the grant's transaction
        changes.flush(tx, update_buckets=False)
    return bucket


def lane_shares(amount: int) -> list[int]:
    """How a grant of `amount` is split into lanes (one share: no split). The shares
    differ by at most one micro-credit and add up to `amount`."""
    most = ledger_setting("BUCKET_LANES", 16)
    return split_evenly(amount, max(1, min(most, amount // ledger_setting("LANE_MIN", 10**9))))


def split_evenly(amount: int, parts: int) -> list[int]:
    """`amount` in `parts` that differ by at most one and add up to it, larger first."""
    base, extra = divmod(amount, parts)
    return [base + (n < extra) for n in range(parts)]


def _replay(bucket: Bucket, request: dict) -> Bucket:
    same = (
        grant_totals(bucket).granted == request["amount"]
        and bucket.kind == request["kind"]
        and bucket.project_id == request["project_id"]
        and bucket.expires_at == request["expires_at"]
    )
    if not same:
        count("grant", "conflict")
        raise Conflict(
            "This idempotency key was used for a different grant.",
            code="idempotency_mismatch",
            field="idempotency_key",
        )
    count("grant", "replay")
    return bucket


def expire_buckets(*, limit: int = 500) -> int:
    """Move what is left of every bucket past its expires_at (database clock) to expired.

    Safe to run concurrently (rows are claimed with SKIP LOCKED; an expired bucket is
    marked and not expired twice). Returns the number of buckets expired.
    """
    expired = 0
    while True:
        with transaction.atomic():
            now = db_now()
            # Also re-sweeps an expired bucket that regained spendable credit, which
            # settle never leaves behind; it makes the task self-healing.
            due = list(
                Bucket.objects.filter(expires_at__lte=now)
                .filter(
                    Q(expired_at__isnull=True)
                    | Q(granted__gt=F("consumed") + F("held") + F("expired"))
                )
                .order_by("pk")
                .select_for_update(skip_locked=True)[:limit]
            )
            for bucket in due:
                count("expire_bucket")
                changes = Changes(org_id=bucket.org_id, at=now)
                if bucket.remaining > 0:
                    changes.move(
                        kind=EntryKind.EXPIRE,
                        bucket_id=bucket.pk,
                        source=Account.AVAILABLE,
                        target=Account.EXPIRED,
                        amount=bucket.remaining,
                        memo=f"bucket expired at {bucket.expires_at.isoformat()}",
                    )
                with LedgerTransaction() as tx:
                    changes.flush(tx)
                if bucket.expired_at is None:
                    Bucket.objects.filter(pk=bucket.pk).update(expired_at=now)
        expired += len(due)
        if len(due) < limit:
            return expired


def adjust(*, bucket, amount: int, reason: str, actor: str = "") -> Bucket:
    """Correct a bucket by an operator: a positive amount issues more credit into it, a
    negative one takes back up to what is left of it. Recorded as an adjustment entry."""
    if isinstance(amount, bool) or not isinstance(amount, int) or amount == 0:
        raise GantryError(
            "amount must be a non-zero integer of micro-credits.", code="invalid", field="amount"
        )
    if not reason.strip():
        raise GantryError("An adjustment needs a reason.", code="invalid", field="reason")
    with transaction.atomic():
        locked = Bucket.objects.select_for_update().get(pk=bucket.pk)
        if amount < 0 and -amount > locked.remaining:
            raise GantryError(
                f"Only {locked.remaining} µc are left in the bucket to take back.",
                code="invalid",
                field="amount",
            )
        source, target = (Account.ISSUED, Account.AVAILABLE)
        if amount < 0:
            source, target = target, source
        changes = Changes(org_id=locked.org_id, at=db_now())
        changes.move(
            kind=EntryKind.ADJUSTMENT,
            bucket_id=locked.pk,
            source=source,
            target=target,
            amount=abs(amount),
            memo=f"{reason}{f' (by {actor})' if actor else ''}",
        )
        with LedgerTransaction() as tx:
            changes.flush(tx)
    count("adjust")
    bucket.refresh_from_db()
    return bucket
