"""The discrete-event simulator: a virtual cluster driven by a scheduling policy.

Virtual time advances from event to event (job submitted, job finished, preempted job
stopped) and the policy is called once per virtual second (the dispatch tick), with a
snapshot built exactly as the database tick builds one. Decisions are applied like the
dispatcher applies them, and checked: a decision that gives a busy GPU, splits a job,
or preempts a protected allocation raises `SimulationError` — the simulator doubles as
an invariant checker of the policy.

Model:
- a placed job runs for its remaining true work; besides the 1 s tick, a submission and
  a release of GPUs wake the dispatcher, which runs a round WAKE_LATENCY_S later, as
  `wake_dispatcher` does on commit: at once after a quiet WAKE_DEBOUNCE_S, else at the
  end of the current window (one wake-up for all of it), so at most one per window;
- jobs checkpoint every `checkpoint_every_s` of progress (some never do); a `Preempt`
  marks its victims stopping, they release their GPUs `stop_delay_s` later, and all
  progress since their last checkpoint is lost (GPU-seconds lost = that progress plus
  the stop delay, times their GPUs); the victim re-queues with its original submit time
  and resumes from its checkpoint;
- the job a `Preempt` or `Reserve` is for gets `claimed_node` set, as the dispatcher
  would (and loses it when placed, since it leaves the queue);
- the snapshot lists the queue as the dispatcher reads it from PostgreSQL: each user's
  first `window_depth` jobs in FIFO order plus every job with a claim, the others
  summed per (tier, org) as `backlog` (see `policy/window.py`); the engine keeps each
  user's queue sorted, so a snapshot costs O(listed jobs), not O(queue);
- admission control: a user may hold at most `queue_quota[tier]` queued jobs (None =
  unlimited); submissions beyond are rejected (the API's 429 "over quota") and counted.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import operator
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from apps.scheduler.policy import (
    TIER_RANK,
    TIERS,
    ClusterSnapshot,
    DecayedUsage,
    Decision,
    Gpu,
    Node,
    Place,
    PolicyConfig,
    Preempt,
    QueueBacklog,
    QueuedJob,
    Reserve,
    RoundResult,
    RunningAllocation,
    backlog_beside,
    observed_runtime_ratios_by_tier,
)
from apps.scheduler.policy.window import listed_users, window_depth

from .fleet import FleetModel
from .workload import DEFAULT_WARMUP_SHARE, JobSpec, Workload

# A policy answers decisions, or a RoundResult whose start estimates the simulator scores.
PolicyFunction = Callable[[ClusterSnapshot], list[Decision] | RoundResult]

JAIN_WINDOW_S = 60  # Jain's index is taken over windows of this many ticks
RUNTIME_SAMPLE = 600  # the runtime ratios are read from this many recent finishes

DEFAULT_QUEUE_QUOTA: dict[str, int | None] = {"free": 1, "paid": 8, "enterprise": None}

_FINISH, _STOP, _WAKE = 0, 1, 2
# A submission or a release wakes the dispatcher (as wake_dispatcher does): a round
# runs this long after it, between the 1 s ticks.
WAKE_LATENCY_S = 0.05
# wake_dispatcher's debounce window (apps.core.wakeup.DEBOUNCE_MS): a wake-up after a quiet
# window is sent at once; those within a window share one at its end, which opens the next.
WAKE_DEBOUNCE_S = 0.1
# How often a round explains the queue (start estimates, reasons): the dispatcher's
# GANTRY_QUEUE_STATE_INTERVAL_S default, so tenants' estimates are read as often as there.
EXPLAIN_EVERY_S = 5.0
PROGRESS_EVERY_S = 30.0  # wall-clock seconds between progress lines, when asked for
_ENTRY_ORDER = operator.itemgetter(0, 1)  # (submitted_at, sequence): never the job itself


class SimulationError(AssertionError):
    """A policy decision broke an invariant of the cluster."""


@dataclass(slots=True)
class JobRecord:
    """What happened to one submitted job (the report's raw material)."""

    id: str
    tier: str
    org: str
    submit_at: float
    tag: str
    gpu_count: int = 1
    admitted: bool = True
    first_start: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    estimated_start: float | None = None  # the first estimate the policy gave it
    # Enterprise: as it arrived, some node had enough GPUs of a type it may use that were
    # free or held by preemptible lower-tier work (where a prompt start is promised).
    startable_at_once: bool = False


@dataclass(slots=True)
class _JobState:
    spec: JobSpec
    record: JobRecord
    done_work: float = 0.0  # progress saved by checkpoints (resume point)
    queued: QueuedJob | None = None
    queue_entry: tuple | None = None  # (submitted_at, sequence, job) in its user's queue


@dataclass(slots=True)
class _Allocation:
    record: RunningAllocation
    job: _JobState
    gpus: list[Gpu]
    start: float
    finish_at: float


@dataclass(slots=True)
class SimResult:
    policy: str
    scenario: str
    fleet: str
    total_gpus: int
    duration_s: float
    warmup_s: float
    end_s: float  # the arrival window's end, or later when waiting jobs were drained
    jobs: list[JobRecord]
    utilisation: list[float]  # busy fraction of each 1 s interval
    work_queued: list[bool]  # whether jobs were waiting after that interval's tick
    org_tier: dict[str, str]
    org_weight: dict[str, float]
    org_gpu_seconds: dict[str, float]  # GPU-seconds held within the measured window
    org_active_ticks: dict[str, int]  # ticks of the window with work queued or running
    window_ticks: int
    # Per JAIN_WINDOW_S window of the measured time: tier -> {org: (mean GPUs held, mean
    # GPUs wanted = held + queued)} over the orgs that had demand in it.
    demand_windows: list[dict[str, dict[str, tuple[float, float]]]]
    idle_usable_gpu_seconds: float  # free GPUs a queued job could use, at each tick
    preemptions: int  # Preempt victims within the window
    lost_gpu_seconds: float  # work lost to preemption within the window
    rejected: dict[str, int]  # submissions refused by the queue quota, per tier
    cpu_time_s: float  # process CPU time of the run (robust to a busy machine)
    policy_time_s: float
    notes: list[str] = field(default_factory=list)
    flood_org: str | None = None
    flood_at: float | None = None


class Simulation:
    def __init__(
        self,
        fleet: FleetModel,
        workload: Workload,
        policy: PolicyFunction,
        *,
        policy_name: str,
        config: PolicyConfig | None = None,
        duration_s: float,
        warmup_s: float | None = None,
        queue_quota: Mapping[str, int | None] | None = None,
        stop_delay_s: float = 5.0,
        drain_s: float = 0.0,
        explain_every_s: float = EXPLAIN_EVERY_S,
        progress: Callable[[str], None] | None = None,
        progress_every_s: float = PROGRESS_EVERY_S,
    ):
        self.fleet = fleet
        self.workload = workload
        self.org_weights = workload.org_weights  # built once: the orgs do not change
        self.policy = policy
        self.policy_name = policy_name
        self.config = config or PolicyConfig()
        self.duration = float(duration_s)
        self.warmup = DEFAULT_WARMUP_SHARE * self.duration if warmup_s is None else float(warmup_s)
        self.quota = dict(DEFAULT_QUEUE_QUOTA if queue_quota is None else queue_quota)
        self.stop_delay = stop_delay_s
        self.drain_s = float(drain_s)
        self.explain_every = float(explain_every_s)
        self._next_explain = -math.inf
        # A long run says where it is (wall clock, not virtual time): a replay of a big
        # trace can take many minutes, and the table only comes at the end.
        self.progress = progress
        self.progress_every = float(progress_every_s)
        self._next_progress = math.inf
        self._cpu_started = 0.0

        self.nodes: list[Node] = []
        self.gpu_by_id: dict[str, Gpu] = {}
        self.node_by_name: dict[str, Node] = {}
        for name, kinds in fleet.nodes:
            gpus = [Gpu(id=f"{name}/{i}", index=i, type=kind) for i, kind in enumerate(kinds)]
            node = Node(name=name, gpus=gpus)
            self.nodes.append(node)
            self.node_by_name[name] = node
            for gpu in gpus:
                self.gpu_by_id[gpu.id] = gpu
        self.gpu_memory = {t.name: t.memory_gb for t in fleet.gpu_types}
        self.total_gpus = fleet.total_gpus

        self.jobs: dict[str, _JobState] = {}
        self.queue: dict[str, QueuedJob] = {}  # job id -> what the policy sees
        # Each user's queued jobs in FIFO order: (submitted_at, sequence, job), as the
        # dispatcher's query orders them (ties in the order they were queued).
        self.user_queues: dict[tuple[str, str, str], list[tuple]] = {}
        self.claimed: dict[str, _JobState] = {}  # queued jobs with a claimed node
        # (tier, org) -> [jobs, GPUs, GPU-seconds at max runtime]
        self.queued_totals: dict[tuple[str, str], list[float]] = {}
        self._queue_seq = 0
        self.allocations: dict[str, _Allocation] = {}
        self.events: list[tuple[float, int, int, str]] = []
        self._seq = 0
        self._alloc_seq = 0
        self.usage = DecayedUsage(self.config.usage_half_life_s)
        self.running_by_user: dict[tuple[str, str, str], int] = {}
        self.queued_by_user: dict[tuple[str, str], int] = {}
        self.queued_by_org: dict[str, int] = {}

        self.busy_gpus = 0
        self._clock = 0.0
        self._interval_busy = 0.0
        self.utilisation: list[float] = []
        self.work_queued: list[bool] = []
        self.org_gpu_seconds: dict[str, float] = {}
        self.org_active_ticks: dict[str, int] = {}
        self.running_by_org: dict[str, int] = {}
        self.window_ticks = 0
        self.preemptions = 0
        self.lost_gpu_seconds = 0.0
        self.rejected = dict.fromkeys(TIERS, 0)
        self.policy_time = 0.0
        self.org_tier = {org.name: org.tier for org in workload.orgs}
        self.queued_gpus_by_org: dict[str, int] = {}
        self.demand_windows: list[dict] = []
        self._window_sums: dict[str, list[float]] = {}  # org -> [GPUs held, GPUs wanted]
        self._window_ticks = 0
        # (tier, ratio) of the last RUNTIME_SAMPLE finishes, and what they give (read again
        # only after a finish: rounds far outnumber finishes).
        self.runtime_ratios: deque[tuple[str, float]] = deque(maxlen=RUNTIME_SAMPLE)
        self._runtime_ratios_by_tier: dict[str, tuple[float, float]] | None = None
        self._wake_window_end = -math.inf  # the debounce window of the last wake-up sent
        self._trailing_wake_at = -math.inf  # when the queued trailing wake-up runs
        self.wake_ups = True
        # Work conservation, measured: free GPUs per type, queued jobs per (allowed
        # types, memory floor), and GPU-seconds idle while queued work could use them.
        self.free_by_type: dict[str, int] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                self.free_by_type[gpu.type] = self.free_by_type.get(gpu.type, 0) + 1
        self.queued_by_shape: dict[tuple, int] = {}
        self.idle_usable_gpu_seconds = 0.0

    # -- main loop ---------------------------------------------------------------------

    def run(self) -> SimResult:
        # The workload and fleet are tens of thousands of long-lived objects: keep the
        # cyclic garbage collector from rescanning them all run long (~1.5x faster).
        gc.freeze()
        try:
            return self._run()
        finally:
            gc.unfreeze()

    def _run(self) -> SimResult:
        started = self._cpu_started = time.process_time()
        if self.progress is not None:
            self._next_progress = time.monotonic() + self.progress_every
        arrivals = self.workload.jobs
        next_arrival = 0
        ticks = math.ceil(self.duration)
        for tick in range(ticks):
            now = float(tick)
            next_arrival = self._advance_to(now, arrivals, next_arrival)
            if tick:
                self._close_interval(now)
            self._accrue_usage(now)
            if self.queue:
                self._round(now)
            self.work_queued.append(bool(self.queue))
            if now >= self.warmup:
                self.window_ticks += 1
                self._sample_demand()
                self.idle_usable_gpu_seconds += self._idle_usable_gpus()
            if time.monotonic() >= self._next_progress:
                self._report_progress(now)
        self._advance_to(self.duration, arrivals, next_arrival)
        self._close_interval(self.duration)
        self._close_demand_window()
        end = self._drain()
        for allocation in self.allocations.values():
            self._charge_window(allocation, self.duration)
        return SimResult(
            policy=self.policy_name,
            scenario=self.workload.name,
            fleet=self.fleet.describe(),
            total_gpus=self.total_gpus,
            duration_s=self.duration,
            warmup_s=self.warmup,
            end_s=end,
            jobs=[state.record for state in self.jobs.values()],
            utilisation=self.utilisation,
            work_queued=self.work_queued,
            org_tier={org.name: org.tier for org in self.workload.orgs},
            org_weight=self.org_weights,
            org_gpu_seconds=self.org_gpu_seconds,
            org_active_ticks=self.org_active_ticks,
            window_ticks=self.window_ticks,
            demand_windows=self.demand_windows,
            idle_usable_gpu_seconds=self.idle_usable_gpu_seconds,
            preemptions=self.preemptions,
            lost_gpu_seconds=self.lost_gpu_seconds,
            rejected=self.rejected,
            cpu_time_s=time.process_time() - started,
            policy_time_s=self.policy_time,
            notes=list(self.workload.notes),
            flood_org=self.workload.flood_org,
            flood_at=self.workload.flood_at,
        )

    def _advance_to(self, now: float, arrivals: Sequence[JobSpec], next_arrival: int) -> int:
        """Process every submission and event up to and including `now`, in time order."""
        events = self.events
        while True:
            event_time = events[0][0] if events else math.inf
            arrival_time = (
                arrivals[next_arrival].submit_at if next_arrival < len(arrivals) else math.inf
            )
            if min(event_time, arrival_time) > now:
                break
            if event_time <= arrival_time:
                at, _, kind, allocation_id = heapq.heappop(events)
                self._integrate(at)
                if kind == _FINISH:
                    self._finish(allocation_id, at)
                    self._wake(at)
                elif kind == _STOP:
                    self._stop(allocation_id, at)
                    self._wake(at)
                elif self.queue and at < self.duration and not float(at).is_integer():
                    self._round(at)
            else:
                self._submit(arrivals[next_arrival])
                self._wake(arrivals[next_arrival].submit_at)
                next_arrival += 1
        self._integrate(now)
        return next_arrival

    def _drain(self) -> float:
        """After the arrivals, keep scheduling (ticks and wake-ups, no new work) for up to
        `drain_s` while jobs wait, so that their starts are seen; returns when it ended.
        Nothing after the arrival window counts towards utilisation, preemptions or
        work lost."""
        now = self.duration
        limit = self.duration + self.drain_s
        tick = math.floor(self.duration) + 1.0
        while self.queue and tick <= limit:
            self._advance_to(tick, (), 0)
            self._accrue_usage(tick)
            if self.queue:
                self._round(tick)
            if time.monotonic() >= self._next_progress:
                self._report_progress(tick)
            now = tick
            tick += 1.0
        return now

    def _report_progress(self, now: float) -> None:
        self._next_progress = time.monotonic() + self.progress_every
        if now < self.duration:
            where = f"{now:,.0f} of {self.duration:,.0f} virtual s"
        else:
            where = f"following the waiting jobs, {now - self.duration:,.0f} s past the window"
        self.progress(
            f"{self.policy_name}: {where}, {len(self.queue):,} queued, "
            f"{len(self.allocations):,} running ({time.process_time() - self._cpu_started:,.0f} s "
            "of CPU so far)"
        )

    def _round(self, now: float) -> None:
        """One dispatch round at `now`: the policy's decisions, applied. A policy that
        explains (start estimates) is asked to on a 1 s tick at most every
        `explain_every_s`, as the dispatcher publishes what tenants read; other rounds
        only decide (explaining changes no decision)."""
        snapshot = self._snapshot(now)
        began = time.perf_counter()
        if getattr(self.policy, "explains", False):
            explain = float(now).is_integer() and now >= self._next_explain
            if explain:
                self._next_explain = now + self.explain_every
            decisions = self.policy(snapshot, explain=explain)
        else:
            decisions = self.policy(snapshot)
        self.policy_time += time.perf_counter() - began
        if isinstance(decisions, RoundResult):
            self._note_estimates(decisions)
            decisions = decisions.decisions
        self._apply(decisions, now)

    def _idle_usable_gpus(self) -> int:
        """Free GPUs (after this tick's round) of a type some queued job may use: idle
        capacity while work that could run there waits. Counted per GPU, whatever the
        node, so a multi-GPU job that needs them on one node may not fit after all."""
        if not self.queue:
            return 0
        usable: set[str] = set()
        for (types, memory), count in self.queued_by_shape.items():
            if count:
                usable.update(
                    t for t in (types or self.free_by_type) if self.gpu_memory.get(t, 0) >= memory
                )
        return sum(self.free_by_type.get(t, 0) for t in usable)

    def _wake(self, at: float) -> None:
        if not self.wake_ups:
            return
        if at >= self._wake_window_end:  # quiet for a window: at once
            self._wake_window_end = at + WAKE_DEBOUNCE_S
            self._push(at + WAKE_LATENCY_S, _WAKE, "")
        elif at >= self._trailing_wake_at:  # the window's first since it opened
            self._trailing_wake_at = self._wake_window_end
            self._wake_window_end += WAKE_DEBOUNCE_S
            self._push(self._trailing_wake_at + WAKE_LATENCY_S, _WAKE, "")

    def _note_estimates(self, result: RoundResult) -> None:
        """Keep the first start estimate of each job (what its tenant first read)."""
        for waiting in result.waiting:
            state = self.jobs.get(waiting.job_id)
            if (
                state is not None
                and state.record.estimated_start is None
                and state.record.first_start is None
                and waiting.estimated_start is not None
            ):
                state.record.estimated_start = waiting.estimated_start

    def _sample_demand(self) -> None:
        """One tick of each org's GPUs held and wanted (held + queued), for the windowed,
        demand-aware Jain's index; orgs without demand are not sampled."""
        sums = self._window_sums
        active = self.org_active_ticks
        for org in {*self.running_by_org, *self.queued_gpus_by_org}:
            held = self.running_by_org.get(org, 0)
            wanted = held + self.queued_gpus_by_org.get(org, 0)
            if wanted:
                entry = sums.setdefault(org, [0.0, 0.0])
                entry[0] += held
                entry[1] += wanted
                active[org] = active.get(org, 0) + 1
        self._window_ticks += 1
        if self._window_ticks >= JAIN_WINDOW_S:
            self._close_demand_window()

    def _close_demand_window(self) -> None:
        if not self._window_ticks:
            return
        window: dict[str, dict[str, tuple[float, float]]] = {}
        ticks = self._window_ticks
        for org, (held, wanted) in self._window_sums.items():
            tier = self.org_tier.get(org, "free")
            window.setdefault(tier, {})[org] = (held / ticks, wanted / ticks)
        self.demand_windows.append(window)
        self._window_sums = {}
        self._window_ticks = 0

    def observed_runtime_ratios(self) -> dict[str, tuple[float, float]]:
        """Each tier's typical and late share of max_runtime_s that its recently finished
        jobs ran, as the dispatcher reads them."""
        if self._runtime_ratios_by_tier is None:
            self._runtime_ratios_by_tier = observed_runtime_ratios_by_tier(
                self.runtime_ratios, min_samples=self.config.runtime_ratio_min_samples
            )
        return self._runtime_ratios_by_tier

    def _integrate(self, at: float) -> None:
        if at > self._clock:
            self._interval_busy += self.busy_gpus * (at - self._clock)
            self._clock = at

    def _close_interval(self, now: float) -> None:
        self.utilisation.append(self._interval_busy / self.total_gpus if self.total_gpus else 0.0)
        self._interval_busy = 0.0

    def _accrue_usage(self, now: float) -> None:
        for (tier, org, user), gpus in self.running_by_user.items():
            if gpus:
                self.usage.add(now, tier, org, user, float(gpus))

    # -- the policy's view -------------------------------------------------------------

    def _snapshot(self, now: float) -> ClusterSnapshot:
        queued, backlog = self._queue_window()
        runtime_ratios = self.observed_runtime_ratios()
        running = []
        for allocation in self.allocations.values():
            record = allocation.record
            every = allocation.job.spec.checkpoint_every_s
            if every:
                saves = math.floor((now - allocation.start) / every)
                record.last_checkpoint_at = allocation.start + saves * every if saves else None
            running.append(record)
        return ClusterSnapshot(
            now=now,
            gpu_types=self.fleet.gpu_types,
            nodes=self.nodes,
            running=running,
            queued=queued,
            org_weights=self.org_weights,
            usage=self.usage.snapshot(now),
            config=self.config,
            backlog=backlog,
            runtime_ratios_by_tier=runtime_ratios,
        )

    def _queue_window(self) -> tuple[list[QueuedJob], dict[tuple[str, str], QueueBacklog]]:
        """What the dispatcher's query returns: each user's first `window_depth` jobs and
        every claimed job, oldest first, and the backlog of the others."""
        depth = window_depth(map(len, self.user_queues.values()), self.config)
        users = None  # every user's first jobs, unless there are too many users
        if len(self.user_queues) > self.config.queue_window_max_jobs:
            users = listed_users(
                ((*key, queue[0][0]) for key, queue in self.user_queues.items()), self.config
            )
        entries = []
        deep = set()  # (tier, org) of the users with jobs left out of the window
        for key, user_queue in self.user_queues.items():
            if users is None or key in users:
                entries.extend(user_queue[:depth])
                if len(user_queue) > depth:
                    deep.add(key[:2])
            else:
                deep.add(key[:2])
        for state in self.claimed.values():
            key = (state.spec.tier, state.spec.org, state.spec.user)
            if (users is not None and key not in users) or bisect.bisect_left(
                self.user_queues[key], state.queue_entry[:2]
            ) >= depth:
                entries.append(state.queue_entry)
        entries.sort(key=_ENTRY_ORDER)
        queued = [entry[2] for entry in entries]
        if not deep:
            return queued, {}  # every queued job is listed
        # Only orgs with a user left out can have a backlog; their listed jobs are
        # counted in window order, and the orgs kept in the totals' order, as for the
        # whole window (the float sums come out the same).
        backlog = backlog_beside(
            {key: totals for key, totals in self.queued_totals.items() if key in deep},
            [job for job in queued if (job.tier, job.org) in deep],
        )
        return queued, backlog

    # -- job lifecycle -----------------------------------------------------------------

    def _submit(self, spec: JobSpec) -> None:
        record = JobRecord(
            id=spec.id,
            tier=spec.tier,
            org=spec.org,
            submit_at=spec.submit_at,
            tag=spec.tag,
            gpu_count=spec.gpu_count,
        )
        state = _JobState(spec=spec, record=record)
        self.jobs[spec.id] = state
        quota = self.quota.get(spec.tier)
        if quota is not None and self.queued_by_user.get((spec.org, spec.user), 0) >= quota:
            record.admitted = False
            self.rejected[spec.tier] += 1
            return
        if spec.tier == "enterprise":
            record.startable_at_once = self._startable_at_once(spec)
        self._enqueue(state)

    def _startable_at_once(self, spec: JobSpec) -> bool:
        """Whether the job could start at once, taking GPUs that are free or held by work
        it may preempt (of a lower tier, preemptible, under the per-job cap, not
        stopping): one node has `spec.gpu_count` such GPUs of one type it may use, and
        the fleet has enough of them for it after the GPUs of the jobs of its tier that
        already wait (counted whatever their types)."""
        rank = TIER_RANK[spec.tier]
        cap = self.config.max_preemptions_per_job
        yielding = {
            gpu.id
            for allocation in self.allocations.values()
            if TIER_RANK[allocation.record.tier] < rank
            and allocation.record.preemptible
            and allocation.record.preemptions < cap
            and not allocation.record.stopping
            for gpu in allocation.gpus
        }
        waiting_ahead = sum(
            gpus
            for (tier, _org), (_jobs, gpus, _work) in self.queued_totals.items()
            if tier == spec.tier
        )
        types = set(spec.gpu_types)
        fits_on_a_node, supply = False, 0
        for node in self.nodes:
            if node.state != "active":
                continue
            counts: dict[str, int] = {}
            for gpu in node.gpus:
                if (
                    (gpu.free or gpu.id in yielding)
                    and (not types or gpu.type in types)
                    and self.gpu_memory.get(gpu.type, 0.0) >= spec.min_gpu_memory_gb
                ):
                    counts[gpu.type] = counts.get(gpu.type, 0) + 1
            supply += sum(counts.values())
            fits_on_a_node = fits_on_a_node or max(counts.values(), default=0) >= spec.gpu_count
            if fits_on_a_node and supply - waiting_ahead >= spec.gpu_count:
                return True  # the rest of the fleet cannot change the answer
        return False

    def _enqueue(self, state: _JobState) -> None:
        spec = state.spec
        state.queued = QueuedJob(
            id=spec.id,
            tier=spec.tier,
            org=spec.org,
            user=spec.user,
            submitted_at=spec.submit_at,
            gpu_count=spec.gpu_count,
            max_runtime_s=spec.max_runtime_s - state.done_work,
            gpu_types=spec.gpu_types,
            min_gpu_memory_gb=spec.min_gpu_memory_gb,
            preemptible=spec.preemptible,
            preemptions=state.record.preemptions,
        )
        self.queue[spec.id] = state.queued
        key = (spec.org, spec.user)
        self.queued_by_user[key] = self.queued_by_user.get(key, 0) + 1
        self.queued_by_org[spec.org] = self.queued_by_org.get(spec.org, 0) + 1
        self._queue_seq += 1
        state.queue_entry = (spec.submit_at, self._queue_seq, state.queued)
        user_queue = self.user_queues.setdefault((spec.tier, spec.org, spec.user), [])
        if not user_queue or user_queue[-1][:2] < state.queue_entry[:2]:
            user_queue.append(state.queue_entry)
        else:  # a preempted job goes back to its original place
            user_queue.insert(
                bisect.bisect_left(user_queue, state.queue_entry[:2]), state.queue_entry
            )
        totals = self.queued_totals.setdefault((spec.tier, spec.org), [0, 0, 0.0])
        totals[0] += 1
        totals[1] += spec.gpu_count
        totals[2] += spec.gpu_count * state.queued.max_runtime_s
        self.queued_gpus_by_org[spec.org] = (
            self.queued_gpus_by_org.get(spec.org, 0) + spec.gpu_count
        )
        shape = (spec.gpu_types, spec.min_gpu_memory_gb)
        self.queued_by_shape[shape] = self.queued_by_shape.get(shape, 0) + 1

    def _dequeue(self, state: _JobState) -> None:
        spec = state.spec
        del self.queue[spec.id]
        work = spec.gpu_count * state.queued.max_runtime_s
        state.queued = None
        self.queued_by_user[(spec.org, spec.user)] -= 1
        self.queued_by_org[spec.org] -= 1
        key = (spec.tier, spec.org, spec.user)
        user_queue = self.user_queues[key]
        del user_queue[bisect.bisect_left(user_queue, state.queue_entry[:2])]
        if not user_queue:
            del self.user_queues[key]
        state.queue_entry = None
        self.claimed.pop(spec.id, None)
        totals = self.queued_totals[(spec.tier, spec.org)]
        totals[0] -= 1
        totals[1] -= spec.gpu_count
        totals[2] = max(0.0, totals[2] - work) if totals[0] else 0.0
        self.queued_gpus_by_org[spec.org] -= spec.gpu_count
        self.queued_by_shape[(spec.gpu_types, spec.min_gpu_memory_gb)] -= 1

    def _release(self, allocation: _Allocation, at: float) -> None:
        del self.allocations[allocation.record.id]
        for gpu in allocation.gpus:
            gpu.free = True
            self.free_by_type[gpu.type] += 1
        self.busy_gpus -= len(allocation.gpus)
        spec = allocation.job.spec
        self.running_by_user[(spec.tier, spec.org, spec.user)] -= len(allocation.gpus)
        self.running_by_org[spec.org] -= len(allocation.gpus)
        self._charge_window(allocation, at)

    def _charge_window(self, allocation: _Allocation, until: float) -> None:
        overlap = min(until, self.duration) - max(allocation.start, self.warmup)
        if overlap > 0:
            org = allocation.job.spec.org
            gpu_seconds = overlap * len(allocation.gpus)
            self.org_gpu_seconds[org] = self.org_gpu_seconds.get(org, 0.0) + gpu_seconds

    def _finish(self, allocation_id: str, at: float) -> None:
        allocation = self.allocations.get(allocation_id)
        if allocation is None or allocation.finish_at != at:
            return  # stopped earlier by a preemption
        self._release(allocation, at)
        allocation.job.record.finished_at = at
        spec = allocation.job.spec
        ratio = spec.work_s / spec.max_runtime_s if spec.max_runtime_s else 1.0
        self.runtime_ratios.append((spec.tier, ratio))
        self._runtime_ratios_by_tier = None

    def _stop(self, allocation_id: str, at: float) -> None:
        allocation = self.allocations.get(allocation_id)
        if allocation is None:
            return  # finished before the preemption took effect: nothing lost
        state = allocation.job
        progress = at - allocation.start
        every = state.spec.checkpoint_every_s
        saved = math.floor(progress / every) * every if every else 0.0
        lost = (progress - saved) * len(allocation.gpus)
        if self.warmup <= at < self.duration:
            self.lost_gpu_seconds += lost
        self._release(allocation, at)
        state.done_work += saved
        state.record.preemptions += 1
        self._enqueue(state)

    # -- decisions ---------------------------------------------------------------------

    def _apply(self, decisions: list[Decision], now: float) -> None:
        for decision in decisions:
            if isinstance(decision, Place):
                self._apply_place(decision, now)
            elif isinstance(decision, Preempt):
                self._apply_preempt(decision, now)
            elif isinstance(decision, Reserve):
                self._apply_reserve(decision)
            else:
                raise SimulationError(f"unknown decision {decision!r}")

    def _apply_place(self, decision: Place, now: float) -> None:
        state = self.jobs.get(decision.job_id)
        if state is None or state.queued is None:
            raise SimulationError(f"{decision}: job is not queued")
        spec = state.spec
        node = self.node_by_name.get(decision.node)
        if node is None or node.state != "active":
            raise SimulationError(f"{decision}: node is not active")
        gpus = [self.gpu_by_id.get(gpu_id) for gpu_id in decision.gpu_ids]
        if len(set(decision.gpu_ids)) != spec.gpu_count or len(gpus) != spec.gpu_count:
            raise SimulationError(f"{decision}: job needs {spec.gpu_count} distinct GPUs")
        node_gpu_ids = {gpu.id for gpu in node.gpus}
        for gpu in gpus:
            if gpu is None or gpu.id not in node_gpu_ids:
                raise SimulationError(f"{decision}: GPU not on node {decision.node}")
            if not gpu.free:
                raise SimulationError(f"{decision}: GPU {gpu.id} is not free")
            if gpu.type != decision.gpu_type:
                raise SimulationError(f"{decision}: GPU {gpu.id} is not {decision.gpu_type}")
        if spec.gpu_types and decision.gpu_type not in spec.gpu_types:
            raise SimulationError(f"{decision}: type not allowed for the job")
        if self.gpu_memory.get(decision.gpu_type, 0) < spec.min_gpu_memory_gb:
            raise SimulationError(f"{decision}: GPU memory below the job's floor")

        self._dequeue(state)
        self._integrate(now)
        for gpu in gpus:
            gpu.free = False
        self.busy_gpus += spec.gpu_count
        self.free_by_type[decision.gpu_type] -= spec.gpu_count
        self._alloc_seq += 1
        allocation_id = f"a{self._alloc_seq}"
        record = RunningAllocation(
            id=allocation_id,
            job_id=spec.id,
            node=decision.node,
            gpu_ids=tuple(decision.gpu_ids),
            tier=spec.tier,
            org=spec.org,
            user=spec.user,
            started_at=now,
            max_runtime_s=spec.max_runtime_s - state.done_work,
            preemptible=spec.preemptible,
            preemptions=state.record.preemptions,
        )
        finish_at = now + (spec.work_s - state.done_work)
        self.allocations[allocation_id] = _Allocation(
            record=record, job=state, gpus=gpus, start=now, finish_at=finish_at
        )
        key = (spec.tier, spec.org, spec.user)
        self.running_by_user[key] = self.running_by_user.get(key, 0) + spec.gpu_count
        self.running_by_org[spec.org] = self.running_by_org.get(spec.org, 0) + spec.gpu_count
        if state.record.first_start is None:
            state.record.first_start = now
        self._push(finish_at, _FINISH, allocation_id)

    def _apply_preempt(self, decision: Preempt, now: float) -> None:
        claimant = self.jobs.get(decision.for_job_id)
        if claimant is None or claimant.queued is None:
            raise SimulationError(f"{decision}: the job it is for is not queued")
        for allocation_id in decision.allocation_ids:
            allocation = self.allocations.get(allocation_id)
            if allocation is None:
                raise SimulationError(f"{decision}: no allocation {allocation_id}")
            record = allocation.record
            if record.stopping or not record.preemptible:
                raise SimulationError(f"{decision}: {allocation_id} may not be preempted")
            if record.node != decision.node:
                raise SimulationError(f"{decision}: victims span nodes")
            rank, claimant_rank = TIER_RANK[record.tier], TIER_RANK[claimant.spec.tier]
            if record.org == claimant.spec.org or (
                rank > claimant_rank and not self._borrowing(record.tier)
            ):
                raise SimulationError(
                    f"{decision}: victim of the same org, or of a higher tier within its ceiling"
                )
            if record.preemptions >= self.config.max_preemptions_per_job:
                raise SimulationError(f"{decision}: victim is past its preemption cap")
            if now - record.started_at < self.config.min_runtime_before_preemption_s:
                raise SimulationError(f"{decision}: victim is still protected")
            record.stopping = True
            if self.warmup <= now < self.duration:
                self.preemptions += 1
            self._push(now + self.stop_delay, _STOP, allocation_id)
        claimant.queued.claimed_node = decision.node
        self.claimed[claimant.spec.id] = claimant

    def _borrowing(self, tier: str) -> bool:
        """Whether the tier holds GPUs beyond its ceiling (in whole GPUs): those may be
        taken back by any tier."""
        held = sum(
            len(a.record.gpu_ids) for a in self.allocations.values() if a.record.tier == tier
        )
        return held > math.floor(self.config.tier_ceilings[tier] * self.total_gpus + 1e-9)

    def _apply_reserve(self, decision: Reserve) -> None:
        state = self.jobs.get(decision.job_id)
        if state is None or state.queued is None:
            raise SimulationError(f"{decision}: job is not queued")
        node = self.node_by_name.get(decision.node)
        if node is None or node.state != "active":
            raise SimulationError(f"{decision}: node is not active")
        state.queued.claimed_node = decision.node
        self.claimed[state.spec.id] = state

    def _push(self, at: float, kind: int, allocation_id: str) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, kind, allocation_id))
