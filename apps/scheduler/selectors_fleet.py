"""The admin's fleet page: every node and GPU, and what runs where right now.

What runs on a GPU is its live GpuAssignment (released_at IS NULL): the attempt holding
it, that attempt's job and the job's org. Four queries whatever the fleet's size, plus
one per tier for its longest-waiting jobs' reasons (from Redis, as the dispatcher
published them) and one Redis read for the workers' pulses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Min
from django.utils import timezone

from apps.fleet import liveness
from apps.fleet.liveness import Pulse
from apps.fleet.models import Gpu, Node, NodeState
from apps.jobs import queue_state
from apps.jobs.models import GpuAssignment, Job, JobStatus


@dataclass
class GpuRow:
    index: int
    gpu_type: str
    device: str
    attempt_id: str | None = None
    attempt_number: int | None = None
    attempt_state: str | None = None
    attempt_started_at: datetime | None = None
    job_id: str | None = None
    job_status: str | None = None
    job_progress: float | None = None
    job_tier: str | None = None
    org_id: str | None = None
    org_name: str | None = None

    @property
    def busy(self) -> bool:
        return self.attempt_id is not None

    @property
    def progress_percent(self) -> int:
        return round((self.job_progress or 0.0) * 100)


@dataclass
class NodeRow:
    pk: int
    name: str
    state: str
    queue: str
    gpus: list[GpuRow] = field(default_factory=list)
    pulse: Pulse | None = None  # its worker's latest pulse; None: no worker seen

    @property
    def pulse_age_s(self) -> int | None:
        return None if self.pulse is None else int(self.pulse.age_s())

    @property
    def busy_count(self) -> int:
        return sum(gpu.busy for gpu in self.gpus)

    @property
    def free_count(self) -> int:
        return len(self.gpus) - self.busy_count


@dataclass
class QueueRow:
    tier: str
    queued: int
    oldest_queued_at: datetime | None
    # Why its longest-waiting jobs wait (the dispatcher's reasons), most common first.
    reasons: list[tuple[str, int]] = field(default_factory=list)

    @property
    def oldest_wait_s(self) -> int | None:
        if self.oldest_queued_at is None:
            return None
        return max(0, int((timezone.now() - self.oldest_queued_at).total_seconds()))


@dataclass
class FleetOverview:
    nodes: list[NodeRow]
    queue: list[QueueRow]

    @property
    def gpu_count(self) -> int:
        return sum(len(node.gpus) for node in self.nodes if node.state != NodeState.DOWN)

    @property
    def busy_count(self) -> int:
        return sum(node.busy_count for node in self.nodes)

    @property
    def node_states(self) -> dict[str, int]:
        """Nodes per state, every state listed (0 where none)."""
        counts = dict.fromkeys(NodeState.values, 0)
        for node in self.nodes:
            counts[node.state] += 1
        return counts


def fleet_overview(*, state: str | None = None) -> FleetOverview:
    """Nodes by name (optionally of one state), each GPU with its live holder, and the
    queue per tier (jobs waiting and the oldest wait's start)."""
    node_query = Node.objects.order_by("name")
    if state:
        node_query = node_query.filter(state=state)
    nodes = {
        node.pk: NodeRow(pk=node.pk, name=node.name, state=node.state, queue=node.queue)
        for node in node_query
    }
    gpus: dict[int, GpuRow] = {}
    for gpu in Gpu.objects.filter(node_id__in=nodes).order_by("node__name", "index"):
        row = GpuRow(index=gpu.index, gpu_type=gpu.gpu_type_id, device=gpu.visible_device)
        gpus[gpu.pk] = row
        nodes[gpu.node_id].gpus.append(row)
    live = GpuAssignment.objects.filter(gpu_id__in=gpus, released_at__isnull=True).values_list(
        "gpu_id",
        "attempt_id",
        "attempt__number",
        "attempt__state",
        "attempt__started_at",
        "attempt__job_id",
        "attempt__job__status",
        "attempt__job__progress",
        "attempt__job__tier",
        "attempt__job__org_id",
        "attempt__job__org__name",
    )
    for gpu_id, attempt, number, a_state, started, job, status, progress, tier, org, name in live:
        row = gpus[gpu_id]
        row.attempt_id, row.attempt_number, row.attempt_state = str(attempt), number, a_state
        row.attempt_started_at = started
        row.job_id, row.job_status, row.job_progress, row.job_tier = (
            str(job),
            status,
            progress,
            tier,
        )
        row.org_id, row.org_name = str(org), name
    queue = [
        QueueRow(tier=tier, queued=count, oldest_queued_at=oldest, reasons=_reasons(tier))
        for tier, count, oldest in Job.objects.filter(status=JobStatus.QUEUED)
        .values_list("tier")
        .annotate(count=Count("id"), oldest=Min("queued_at"))
        .order_by("tier")
    ]
    by_name = {node.name: node for node in nodes.values()}
    for name, pulse in liveness.pulses(list(by_name)).items():
        by_name[name].pulse = pulse
    return FleetOverview(nodes=list(nodes.values()), queue=queue)


def nodes_shown(fleet: FleetOverview, *, busy_only: bool, name_contains: str) -> list[NodeRow]:
    """The nodes of `fleet` the page lists: those running something (`busy_only`), whose
    name contains `name_contains` (any case), in name order."""
    needle = name_contains.strip().lower()
    return [
        node
        for node in fleet.nodes
        if (node.busy_count or not busy_only) and needle in node.name.lower()
    ]


REASON_SAMPLE = 200  # the longest-waiting jobs of a tier whose reasons are counted


def _reasons(tier: str) -> list[tuple[str, int]]:
    """The dispatcher's reasons (the operators' full wording) for the tier's
    longest-waiting queued jobs, with how many share each, most common first."""
    oldest = (
        Job.objects.filter(status=JobStatus.QUEUED, tier=tier)
        .order_by("queued_at")
        .values_list("id", flat=True)[:REASON_SAMPLE]
    )
    counts: dict[str, int] = {}
    for state in queue_state.read(oldest).values():
        reason = state.detail or state.reason
        counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:3]
