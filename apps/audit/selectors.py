"""The operators' audit trail: every credit and scheduling decision on one timeline.

Four append-only sources are merged, newest first:

    operator  OperatorAction   what an operator did in the admin or API (who, what, before/after)
    dispatch  DispatchDecision placements, preemptions and reservations, with reasons
    job       JobEvent         every job transition (and notes such as "cancel requested")
    ledger    Entry            every movement of credit (the positive leg of each pair)

It lives in the scheduler because the scheduler is the one app that already depends on
all the others (jobs, ledger, accounts); reading them from accounts would invert that.

A page is read with one keyset query per source, each bounded by the page size, and
merged in Python: at most 4 * (limit + 1) rows are read whatever the history's size. The
order is total — (at, source rank, id) descending — so the cursor (the last row's key)
resumes exactly, also among rows that share an instant (the legs of one ledger INSERT;
rows are stamped with the database's statement time). Sources that tie sort in causal
order: an operator action, then the decision, then the job event, then the ledger
entries it caused, listed newest first.
"""

from __future__ import annotations

import base64
import heapq
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import F, Q, QuerySet
from django.utils.dateparse import parse_datetime

from apps.accounts.models import OperatorAction
from apps.accounts.operator_actions import ACTIONS
from apps.core.errors import GantryError
from apps.core.money import credits
from apps.jobs.models import JobEvent, JobStatus
from apps.ledger.models import Entry, EntryKind
from apps.scheduler.models import DecisionKind, DecisionOutcome, DispatchDecision

# Causal order within one instant; a higher rank is listed first (newest-first order).
SOURCES = ("operator", "dispatch", "job", "ledger")
RANK = {source: rank for rank, source in enumerate(SOURCES)}
JOB_NOTE = "note"  # a job event that is not a status change
SUBKINDS: dict[str, tuple[str, ...]] = {
    "operator": tuple(ACTIONS),
    "dispatch": tuple(DecisionKind.values),
    "job": (*JobStatus.values, JOB_NOTE),
    "ledger": tuple(EntryKind.values),
}
KINDS = (*SOURCES, *(f"{source}.{sub}" for source in SOURCES for sub in SUBKINDS[source]))
EVERYTHING = "all"
ROUTINE = frozenset({"ledger.capture"})
"""Left out unless asked for by name or with `all`: metering, one capture per running
job per fold, is bookkeeping, not a decision, and would bury the decisions."""
MAX_LIMIT = 200


@dataclass(frozen=True)
class AuditFilters:
    """What to show. `kinds` holds sources ("ledger") or kinds ("dispatch.preempt");
    empty: every decision (all but ROUTINE); `{"all"}`: everything, metering included.
    `since` is inclusive, `until` exclusive."""

    org_id: uuid.UUID | None = None
    job_id: uuid.UUID | None = None
    since: datetime | None = None
    until: datetime | None = None
    kinds: frozenset[str] = frozenset()

    def subkinds(self, source: str) -> frozenset[str] | None:
        """The subkinds of `source` wanted: None for all, empty for none."""
        if EVERYTHING in self.kinds or source in self.kinds:
            return None
        if not self.kinds:
            prefix = f"{source}."
            routine = {k[len(prefix) :] for k in ROUTINE if k.startswith(prefix)}
            return frozenset(SUBKINDS[source]) - routine if routine else None
        prefix = f"{source}."
        return frozenset(k[len(prefix) :] for k in self.kinds if k.startswith(prefix))


def parse_kinds(value: str | Iterable[str] | None) -> frozenset[str]:
    """A comma-separated list (or iterable) of kinds; an unknown one is a 400 naming `kind`."""
    if not value:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else list(value)
    kinds = frozenset(item.strip() for item in items if item.strip())
    unknown = sorted(kinds - {*KINDS, EVERYTHING})
    if unknown:
        raise GantryError(
            f"Unknown kind {unknown[0]!r}: use a source ({', '.join(SOURCES)}), a kind "
            "such as dispatch.preempt, job.failed, ledger.settle, operator.node.drain, or "
            "all (metering captures included).",
            code="invalid",
            field="kind",
        )
    return kinds


@dataclass(frozen=True, order=True)
class AuditCursor:
    """The position of one row on the timeline; the next page starts strictly below it."""

    at: datetime
    rank: int
    pk: int

    def encode(self) -> str:
        raw = f"{self.at.isoformat()}|{self.rank}|{self.pk}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> AuditCursor:
        """Parse a token made by `encode`; anything else is a 400 naming `cursor`."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
            at_text, rank_text, pk_text = raw.split("|")
            at, rank, pk = parse_datetime(at_text), int(rank_text), int(pk_text)
            if at is None or at.tzinfo is None or rank not in RANK.values():
                raise ValueError(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise GantryError("Invalid cursor.", code="invalid", field="cursor") from exc
        return cls(at=at, rank=rank, pk=pk)


@dataclass(frozen=True)
class AuditItem:
    at: datetime
    source: str
    pk: int
    kind: str
    org_id: uuid.UUID | None
    job_id: uuid.UUID | None
    actor: str
    summary: str
    reason: str = ""
    data: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.source}:{self.pk}"

    @property
    def position(self) -> AuditCursor:
        return AuditCursor(at=self.at, rank=RANK[self.source], pk=self.pk)


@dataclass(frozen=True)
class AuditPage:
    items: list[AuditItem]
    next_cursor: AuditCursor | None


def audit_page(
    *, filters: AuditFilters, cursor: AuditCursor | None = None, limit: int = 50
) -> AuditPage:
    """One page of the merged timeline, newest first, strictly after `cursor`.

    Reads at most limit + 1 rows per source (4 bounded queries); `next_cursor` is None
    on the last page.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise GantryError(f"limit must be 1 to {MAX_LIMIT}.", code="invalid", field="limit")
    streams = []
    for source in SOURCES:
        wanted = filters.subkinds(source)
        if wanted is not None and not wanted:
            continue
        query, to_item = _READERS[source](filters, wanted)
        at = _AT[source]
        query = query.filter(_below(cursor, RANK[source], at)).order_by(f"-{at}", "-id")
        streams.append([to_item(row) for row in query[: limit + 1]])
    merged = list(heapq.merge(*streams, key=lambda item: item.position, reverse=True))
    items = merged[:limit]
    more = len(merged) > limit
    return AuditPage(items=items, next_cursor=items[-1].position if more and items else None)


# --- one reader per source ----------------------------------------------------------------

_AT = {"operator": "at", "dispatch": "at", "job": "at", "ledger": "created_at"}


def _below(cursor: AuditCursor | None, rank: int, at: str) -> Q:
    """Rows of a source of `rank` strictly after `cursor` in (at, rank, id) descending."""
    if cursor is None:
        return Q()
    if rank < cursor.rank:
        return Q(**{f"{at}__lte": cursor.at})
    if rank > cursor.rank:
        return Q(**{f"{at}__lt": cursor.at})
    return Q(**{f"{at}__lt": cursor.at}) | Q(**{at: cursor.at, "id__lt": cursor.pk})


def _window(at: str, filters: AuditFilters) -> Q:
    q = Q()
    if filters.since is not None:
        q &= Q(**{f"{at}__gte": filters.since})
    if filters.until is not None:
        q &= Q(**{f"{at}__lt": filters.until})
    return q


Reader = Callable[[AuditFilters, frozenset[str] | None], tuple[QuerySet, Callable]]


def _operator_actions(filters: AuditFilters, wanted: frozenset[str] | None):
    query = OperatorAction.objects.filter(_window("at", filters))
    if filters.org_id is not None:
        query = query.filter(org_id=filters.org_id)
    if filters.job_id is not None:
        query = query.filter(job_id=filters.job_id)
    if wanted is not None:
        query = query.filter(action__in=wanted)
    query = query.values(
        "id",
        "at",
        "actor",
        "action",
        "target_type",
        "target_id",
        "org_id",
        "job_id",
        "outcome",
        "before",
        "after",
        "note",
    )

    def item(row) -> AuditItem:
        refused = row["outcome"] == OperatorAction.Outcome.REFUSED
        return AuditItem(
            at=row["at"],
            source="operator",
            pk=row["id"],
            kind=f"operator.{row['action']}",
            org_id=row["org_id"],
            job_id=row["job_id"],
            actor=row["actor"],
            summary=f"{row['action']} {row['target_type']} {row['target_id']}"
            + (" (refused)" if refused else ""),
            reason=row["note"],
            data={
                "target_type": row["target_type"],
                "target_id": row["target_id"],
                "outcome": row["outcome"],
                "before": row["before"],
                "after": row["after"],
            },
        )

    return query, item


def _dispatch_decisions(filters: AuditFilters, wanted: frozenset[str] | None):
    query = DispatchDecision.objects.filter(_window("at", filters))
    if filters.org_id is not None:
        query = query.filter(job__org_id=filters.org_id)
    if filters.job_id is not None:
        # A preemption concerns its victims as much as the job it makes room for. A UNION
        # lets each half use its own access path (an OR walks the whole `at` index).
        about = DispatchDecision.objects.filter(job_id=filters.job_id).values("pk")
        victim = DispatchDecision.objects.filter(victims__contains=[filters.job_id]).values("pk")
        query = query.filter(pk__in=about.union(victim))
    if wanted is not None:
        query = query.filter(kind__in=wanted)
    query = query.values(
        "id",
        "at",
        "tick",
        "kind",
        "outcome",
        "job_id",
        "job__org_id",
        "node_name",
        "gpu_type",
        "gpu_indices",
        "attempt_id",
        "victims",
        "reason",
        "skip_reason",
    )

    def item(row) -> AuditItem:
        return AuditItem(
            at=row["at"],
            source="dispatch",
            pk=row["id"],
            kind=f"dispatch.{row['kind']}",
            org_id=row["job__org_id"],
            job_id=row["job_id"],
            actor="scheduler",
            summary=_decision_summary(row),
            reason=row["reason"],
            data={
                "outcome": row["outcome"],
                "node": row["node_name"],
                "gpu_type": row["gpu_type"],
                "gpu_indices": list(row["gpu_indices"]),
                "attempt": str(row["attempt_id"]) if row["attempt_id"] else None,
                "victims": [str(victim) for victim in row["victims"]],
                "skip_reason": row["skip_reason"],
                "tick": str(row["tick"]),
            },
        )

    return query, item


def _decision_summary(row) -> str:
    node, kind = row["node_name"], row["kind"]
    if kind == DecisionKind.PLACE:
        gpus = ",".join(str(i) for i in row["gpu_indices"])
        text = f"place on {node} GPU {gpus} ({row['gpu_type']})"
    elif kind == DecisionKind.PREEMPT:
        text = f"preempt {len(row['victims'])} job(s) on {node}"
    else:
        text = f"reserve {node}"
    if row["outcome"] == DecisionOutcome.SKIPPED:
        text += f" — skipped: {row['skip_reason']}"
    return text


def _job_events(filters: AuditFilters, wanted: frozenset[str] | None):
    query = JobEvent.objects.filter(_window("at", filters))
    if filters.org_id is not None:
        query = query.filter(job__org_id=filters.org_id)
    if filters.job_id is not None:
        query = query.filter(job_id=filters.job_id)
    if wanted is not None:
        statuses = wanted - {JOB_NOTE}
        chosen = Q(to_status__in=statuses) & ~Q(from_status=F("to_status"))
        if JOB_NOTE in wanted:
            chosen |= Q(from_status=F("to_status"))
        query = query.filter(chosen)
    query = query.values(
        "id",
        "at",
        "job_id",
        "job__org_id",
        "attempt_id",
        "from_status",
        "to_status",
        "reason",
        "actor",
        "data",
    )

    def item(row) -> AuditItem:
        note = row["from_status"] == row["to_status"]
        return AuditItem(
            at=row["at"],
            source="job",
            pk=row["id"],
            kind=f"job.{JOB_NOTE if note else row['to_status']}",
            org_id=row["job__org_id"],
            job_id=row["job_id"],
            actor=row["actor"],
            summary=f"note ({row['to_status']})"
            if note
            else f"{row['from_status'] or 'new'} → {row['to_status']}",
            reason=row["reason"],
            data={
                "from": row["from_status"],
                "to": row["to_status"],
                "attempt": str(row["attempt_id"]) if row["attempt_id"] else None,
                **({"event": row["data"]} if row["data"] else {}),
            },
        )

    return query, item


def _ledger_entries(filters: AuditFilters, wanted: frozenset[str] | None):
    # Each movement is a pair of legs (+x to one account, -x from its counter account);
    # the positive leg names both, so listing it alone shows every movement once.
    query = Entry.objects.filter(_window("created_at", filters), amount__gt=0)
    if filters.org_id is not None:
        query = query.filter(org_id=filters.org_id)
    if filters.job_id is not None:
        query = query.filter(job_id=filters.job_id)
    if wanted is not None:
        query = query.filter(kind__in=wanted)
    query = query.values(
        "id",
        "created_at",
        "txn",
        "kind",
        "amount",
        "account",
        "counter_account",
        "org_id",
        "bucket_id",
        "bucket__kind",
        "hold_id",
        "job_id",
        "memo",
    )

    def item(row) -> AuditItem:
        return AuditItem(
            at=row["created_at"],
            source="ledger",
            pk=row["id"],
            kind=f"ledger.{row['kind']}",
            org_id=row["org_id"],
            job_id=row["job_id"],
            actor="ledger",
            summary=(
                f"{row['kind']}: {credits(row['amount'])} credits "
                f"{row['counter_account']} → {row['account']} ({row['bucket__kind']} bucket)"
            ),
            reason=row["memo"],
            data={
                "amount": row["amount"],
                "from": row["counter_account"],
                "to": row["account"],
                "bucket": str(row["bucket_id"]),
                "bucket_kind": row["bucket__kind"],
                "hold": str(row["hold_id"]) if row["hold_id"] else None,
                "txn": str(row["txn"]),
            },
        )

    return query, item


_READERS: dict[str, Reader] = {
    "operator": _operator_actions,
    "dispatch": _dispatch_decisions,
    "job": _job_events,
    "ledger": _ledger_entries,
}
