"""A small platform with something in every table the operators look at."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.contrib.auth.models import Group
from django.utils import timezone

from apps.accounts.models import Org, Project
from apps.accounts.operator_actions import record_operator_action
from apps.accounts.services import issue_api_key
from apps.fleet.models import Node
from apps.jobs.models import Job, QuarantinedFingerprint
from apps.jobs.services.spec import JobSpec
from apps.jobs.services.submission import submit_job
from apps.ledger import services as ledger
from apps.ledger.models import LedgerAuditEvent
from apps.scheduler.models import DispatchDecision, NodeClaim, UsageAccount
from apps.scheduler.services.dispatch import run_dispatch_tick
from tests.factories import OrgFactory, ProjectFactory, UserFactory
from tests.scheduler.factories import NodeFactory, live_attempt, start_attempt, unique_name

CREDIT = 1_000_000


def funded(name: str, tier: str, credits: int = 1_000) -> Org:
    org = OrgFactory(name=f"{name}-{uuid.uuid4().hex[:6]}", tier=tier)
    ledger.grant(org=org, amount=credits * CREDIT, kind="paid", actor="test")
    return org


def submitted(org: Org, *, project: Project | None = None, prompt: str = "a fox", **spec) -> Job:
    """A job admitted the way the API admits one: hold, queued event, ledger entries."""
    project = project or ProjectFactory(org=org)
    options = {"max_runtime_s": 600, "gpu_types": ("H100",), **spec}
    return submit_job(
        org=org,
        project=project,
        spec=JobSpec(params={"prompt": prompt, "steps": 5}, **options),
        enforce_quota=False,
    ).job


def placed_by_tick(job: Job, *, patience_s: float = 10.0) -> None:
    """Run dispatch ticks until one has run and placed `job`. A tick is skipped while
    another session holds the dispatcher's lock: wait that out for a few seconds, and
    fail saying whether the tick ran (a full run of the suite once found no attempt
    here, cause unknown)."""
    deadline = time.monotonic() + patience_s
    while True:
        result = run_dispatch_tick()
        if live_attempt(job) is not None:
            return
        if result.ran or time.monotonic() > deadline:
            raise AssertionError(
                f"job {job.pk} not placed: the tick "
                + (
                    f"ran and decided {result.decisions}"
                    if result.ran
                    else "was skipped (lock held)"
                )
            )
        time.sleep(0.2)


@dataclass
class Platform:
    paid: Org
    free: Org
    busy_node: Node
    idle_node: Node
    running: Job
    waiting: Job


def platform() -> Platform:
    """Two orgs, two nodes, a running job and a queued one whose preemption claim waits."""
    paid, free = funded("acme-video", "paid"), funded("tinyco", "free")
    project, user = ProjectFactory(org=paid), UserFactory(org=paid)
    issue_api_key(org=paid, project=project, user=user, name="ci")
    issue_api_key(operator=True, name="ops")
    busy = NodeFactory(name=unique_name("busy"), gpus=2)
    idle = NodeFactory(name=unique_name("idle"), gpus=1, gpus__type="A100")
    running = submitted(paid, project=project, prompt="a red fox in snow", gpu_count=2)
    placed_by_tick(running)
    start_attempt(live_attempt(running), ran_for_s=60)
    waiting = submitted(free, prompt="a quiet harbour", gpu_count=2)
    decision = DispatchDecision.objects.create(
        tick=uuid.uuid4(),
        kind="preempt",
        outcome="applied",
        job=waiting,
        node_name=busy.name,
        gpu_type="H100",
        victims=[running.pk],
        reason="waited past the tier's preemption threshold",
    )
    NodeClaim.objects.create(job=waiting, node=busy, kind="preempt", decision=decision)
    ledger.set_budget(org=free, limit=CREDIT, period="total", mode="soft")
    submitted(free, prompt="over a soft budget")  # allowed, and a budget alert recorded
    LedgerAuditEvent.objects.create(
        check_name="bucket_balance", subject="bucket x", detail="drift", fingerprint="f-1"
    )
    UsageAccount.objects.create(scope="org", key=str(paid.pk), value=60.0, as_of=timezone.now())
    QuarantinedFingerprint.objects.create(
        fingerprint=running.fingerprint, reason="hung on 3 nodes", node_count=3, sample_job=running
    )
    record_operator_action(
        actor="admin:someone", action="node.drain", target_type="node", target_id=idle.name
    )
    Group.objects.create(name="operators")
    return Platform(paid, free, busy, idle, running, waiting)
