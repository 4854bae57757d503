"""Turning a `SimResult` into the figures of the report.

Definitions (all over the measured window [warm-up, end)):

- utilisation while work is queued: GPU-seconds held / GPU-seconds available, over the
  1 s intervals after whose tick some job was still waiting;
- idle, usable by queued work: at each tick, after the round, the free GPUs of a type
  that some queued job may use (any node: a gang job may still not fit), as a share of
  all GPU-time in the window: what work conservation should keep near zero;
- start wait: first start − submission, for admitted jobs submitted in the window (their
  starts are followed into the drain after it, if the run has one); a job still waiting
  at the end counts with its wait so far (a lower bound), so "max" is the longest any
  job has waited, started or not;
- enterprise, startable at once: the start waits of the enterprise jobs that, as they
  arrived, could have started on GPUs that were free or held by preemptible lower-tier
  work (enough of one type on one node): where the promise of a prompt start applies;
- Jain's index per tier, time-weighted: the measured time is cut into 60 s windows; in
  each, over the orgs of the tier that had demand (work queued or running), x_i = the
  GPUs org i held on average / its max-min fair share of what the tier held (water-fill
  by org weights, capped by what the org wanted: held + queued), J = (Σx)² / (n Σx²);
  the index is the mean over the windows where at least two orgs had demand, so it is
  defined on bursty traces of many small tenants; 1 means every org got its fair share;
- start-time estimates: |actual first start − the first estimate the job's tenant
  read|, over the jobs that got one;
- work lost: GPU-seconds of progress destroyed by preemption (since the victims' last
  checkpoint, plus their stop delay), also as a share of all GPU time in the window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from apps.scheduler.policy import TIERS, water_fill

from .engine import JobRecord, SimResult


@dataclass(frozen=True, slots=True)
class WaitStats:
    count: int
    still_waiting: int
    p50: float
    p95: float
    max: float

    def cell(self) -> str:
        if not self.count:
            return "–"
        return f"{self.p50:.0f} / {self.p95:.0f} / {self.max:.0f}"


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    scenario: str
    utilisation_while_queued: float
    idle_usable: float  # GPU-time idle while queued work could use it, over all GPU-time
    waits: dict[str, WaitStats]
    startable_waits: WaitStats  # enterprise jobs startable at once (module docstring)
    jain: dict[str, tuple[float | None, int]]  # tier -> (index, orgs counted)
    jain_throughout: dict[str, tuple[float | None, int]]  # the earlier definition
    preemptions: int
    lost_gpu_seconds: float
    lost_fraction: float
    admitted: int
    rejected: int
    started: int
    eta_error: tuple[float, float, int] | None  # (p50, p90, jobs) of |start - estimate|
    cpu_time_s: float
    policy_time_s: float


def jain_index(values: Iterable[float]) -> float | None:
    xs = [float(v) for v in values]
    if len(xs) < 2:
        return None
    square_sum = sum(x * x for x in xs)
    if square_sum == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * square_sum)


def wait_stats(
    result: SimResult, keep: Callable[[JobRecord], bool] = lambda record: True
) -> WaitStats:
    waits, still_waiting = [], 0
    for record in result.jobs:
        if not record.admitted or not result.warmup_s <= record.submit_at < result.duration_s:
            continue
        if not keep(record):
            continue
        if record.first_start is None:
            still_waiting += 1
            waits.append(result.end_s - record.submit_at)
        else:
            waits.append(record.first_start - record.submit_at)
    if not waits:
        return WaitStats(0, 0, 0.0, 0.0, 0.0)
    values = np.asarray(waits)
    return WaitStats(
        count=len(waits),
        still_waiting=still_waiting,
        p50=float(np.percentile(values, 50)),
        p95=float(np.percentile(values, 95)),
        max=float(values.max()),
    )


def tier_jain(result: SimResult, tier: str) -> tuple[float | None, int]:
    """Time-weighted Jain's index of the tier (see the module docstring), and the most
    orgs with demand in any one window."""
    indexes, most = [], 0
    for window in result.demand_windows:
        orgs = window.get(tier, {})
        most = max(most, len(orgs))
        if len(orgs) < 2:  # one org alone is trivially fair: no index for the window
            continue
        held = {org: h for org, (h, _) in orgs.items()}
        wanted = {org: w for org, (_, w) in orgs.items()}
        weights = {org: result.org_weight.get(org, 1.0) for org in orgs}
        fair = water_fill(sum(held.values()), wanted, weights)
        shares = [held[org] / fair[org] for org in orgs if fair.get(org, 0.0) > 1e-9]
        index = jain_index(shares)
        if index is not None:
            indexes.append(index)
    if not indexes:
        return None, most
    return float(np.mean(indexes)), most


def tier_jain_throughout(result: SimResult, tier: str) -> tuple[float | None, int]:
    """The earlier definition, kept for comparison with earlier reports: x_i = GPU-seconds
    / weight over the whole window, over the orgs with demand during >= 95 % of its
    ticks (undefined on traces where few orgs have demand that long)."""
    if not result.window_ticks:
        return None, 0
    shares = [
        result.org_gpu_seconds.get(org, 0.0) / result.org_weight.get(org, 1.0)
        for org, org_tier in result.org_tier.items()
        if org_tier == tier and result.org_active_ticks.get(org, 0) >= 0.95 * result.window_ticks
    ]
    return jain_index(shares), len(shares)


def eta_error(result: SimResult) -> tuple[float, float, int] | None:
    errors = [
        abs(record.first_start - record.estimated_start)
        for record in result.jobs
        if record.admitted
        and result.warmup_s <= record.submit_at < result.duration_s
        and record.first_start is not None
        and record.estimated_start is not None
    ]
    if not errors:
        return None
    values = np.asarray(errors)
    return float(np.percentile(values, 50)), float(np.percentile(values, 90)), len(errors)


def utilisation_while_queued(result: SimResult) -> float:
    start = int(result.warmup_s)
    samples = [
        busy
        for second, busy in enumerate(result.utilisation)
        if second >= start and second < len(result.work_queued) and result.work_queued[second]
    ]
    return float(np.mean(samples)) if samples else 0.0


def summarize(result: SimResult) -> Summary:
    window = result.duration_s - result.warmup_s
    gpu_time = result.total_gpus * window
    admitted = [r for r in result.jobs if r.admitted]
    return Summary(
        policy=result.policy,
        scenario=result.scenario,
        utilisation_while_queued=utilisation_while_queued(result),
        idle_usable=result.idle_usable_gpu_seconds / gpu_time if gpu_time else 0.0,
        waits={tier: wait_stats(result, lambda r, t=tier: r.tier == t) for tier in TIERS},
        startable_waits=wait_stats(
            result, lambda r: r.tier == "enterprise" and r.startable_at_once
        ),
        jain={tier: tier_jain(result, tier) for tier in TIERS},
        jain_throughout={tier: tier_jain_throughout(result, tier) for tier in TIERS},
        preemptions=result.preemptions,
        lost_gpu_seconds=result.lost_gpu_seconds,
        lost_fraction=result.lost_gpu_seconds / gpu_time if gpu_time else 0.0,
        admitted=len(admitted),
        rejected=sum(result.rejected.values()),
        started=sum(1 for r in admitted if r.first_start is not None),
        eta_error=eta_error(result),
        cpu_time_s=result.cpu_time_s,
        policy_time_s=result.policy_time_s,
    )


TABLE_TIERS = ("enterprise", "paid", "free")


def format_table(summaries: list[Summary]) -> str:
    """A Markdown table, one row per policy run."""
    header = (
        "| policy | util. while queued | idle, usable by queued work | "
        + " | ".join(f"{tier} wait p50 / p95 / max (s)" for tier in TABLE_TIERS)
        + " | enterprise startable at once: jobs, wait p95 (s)"
        + " | Jain "
        + " / ".join(TABLE_TIERS)
        + " | waiting at end "
        + " / ".join(TABLE_TIERS)
        + " | preemptions | work lost GPU-h (% of GPU time) | admitted / rejected"
        + " | start estimate error p50 / p90 (s) | sim CPU s |"
    )
    rule = "|" + "---|" * (header.count("|") - 1)
    rows = [header, rule]
    for s in summaries:
        jain = " / ".join(
            "–" if s.jain[tier][0] is None else f"{s.jain[tier][0]:.3f}" for tier in TABLE_TIERS
        )
        waiting = " / ".join(str(s.waits[tier].still_waiting) for tier in TABLE_TIERS)
        estimate = "–" if s.eta_error is None else f"{s.eta_error[0]:.0f} / {s.eta_error[1]:.0f}"
        rows.append(
            f"| {s.policy} | {s.utilisation_while_queued:.1%} | {s.idle_usable:.2%} | "
            + " | ".join(s.waits[tier].cell() for tier in TABLE_TIERS)
            + f" | {s.startable_waits.count}, {s.startable_waits.p95:.0f}"
            + f" | {jain} | {waiting} | {s.preemptions} | "
            f"{s.lost_gpu_seconds / 3600:.1f} ({s.lost_fraction:.2%}) | "
            f"{s.admitted} / {s.rejected} | {estimate} | {s.cpu_time_s:.0f} |"
        )
    return "\n".join(rows)


def waits_by_size(result: SimResult) -> dict[tuple[str, int], WaitStats]:
    """(tier, GPUs per job) -> the start waits of that tier's jobs of that size, measured
    as the table's (jobs submitted in the measured window; one still waiting counts its
    wait so far)."""
    sizes = sorted({(record.tier, record.gpu_count) for record in result.jobs})
    return {
        (tier, gpus): wait_stats(
            result, lambda record, t=tier, g=gpus: record.tier == t and record.gpu_count == g
        )
        for tier, gpus in sizes
    }


def format_waits_by_size(results: list[SimResult]) -> str:
    """A Markdown table of each run's start waits by tier and job size (GPUs per job):
    where a tier's wait goes, its gang jobs or its single-GPU requests."""
    rows = [
        "| policy | tier | GPUs per job | jobs | wait p50 / p95 / max (s) | waiting at end |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        by_size = waits_by_size(result)
        for tier in TABLE_TIERS:
            for (of_tier, gpus), stats in by_size.items():
                if of_tier == tier and stats.count:
                    rows.append(
                        f"| {result.policy} | {tier} | {gpus} | {stats.count} | {stats.cell()} "
                        f"| {stats.still_waiting} |"
                    )
    return "\n".join(rows)


def jain_throughout_cell(summary: Summary) -> str:
    return " / ".join(
        "–" if value is None else f"{value:.3f} ({orgs} orgs)"
        for value, orgs in (summary.jain_throughout[tier] for tier in TABLE_TIERS)
    )


def jain_counts(summary: Summary) -> str:
    return ", ".join(
        f"{tier} up to {summary.jain[tier][1]} orgs with demand per window" for tier in TABLE_TIERS
    )
