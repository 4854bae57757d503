"""Run a scenario under one or more policies and assemble the report."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from apps.scheduler.policy import PolicyConfig, schedule_round

from . import baselines, workload
from .engine import EXPLAIN_EVERY_S, PolicyFunction, SimResult, Simulation
from .fleet import FleetModel, fleet_from_file, fleet_of_types, synthetic_fleet
from .metrics import (
    Summary,
    format_table,
    format_waits_by_size,
    jain_counts,
    jain_throughout_cell,
    summarize,
    wait_stats,
)


def fair(snapshot, *, explain: bool = True):
    """Gantry's policy, with the start estimates that the report scores."""
    return schedule_round(snapshot, explain=explain)


fair.explains = True  # the engine asks for estimates as often as the dispatcher publishes them

POLICIES: dict[str, PolicyFunction] = {
    "fair": fair,
    "fifo": baselines.fifo,
    "strict": baselines.strict_priority,
}
SCENARIOS = ("steady", "flood", "spike", "bursty", "trace")


@dataclass(frozen=True, slots=True)
class FloodImpact:
    """Other enterprise customers' p95 start wait with and without the flood."""

    policy: str
    p95_without: float
    p95_with: float
    jobs: int

    @property
    def growth(self) -> float:
        if self.p95_without <= 0:
            return 0.0 if self.p95_with <= 0 else float("inf")
        return self.p95_with / self.p95_without - 1.0


@dataclass(slots=True)
class ScenarioReport:
    scenario: str
    fleet: FleetModel
    notes: list[str]
    results: list[SimResult]
    summaries: list[Summary]
    flood: list[FloodImpact] = field(default_factory=list)
    baseline_results: list[SimResult] = field(default_factory=list)  # flood: without it
    plots: list[Path] = field(default_factory=list)
    offered_load: float = 0.0
    offered_gpu_hours: float = 0.0
    warmup_jobs: int = 0

    def text(self, *, by_size: bool = False) -> str:
        """The report as printed; `by_size` adds each run's waits by tier and job size."""
        lines = [f"scenario: {self.scenario} — fleet: {self.fleet.describe()}"]
        lines += [f"workload: {note}" for note in self.notes]
        if self.results:
            first = self.results[0]
            lines.append(
                f"virtual time: {first.duration_s:.0f} s, measured after a "
                f"{first.warmup_s:.0f} s warm-up ({self.warmup_jobs} jobs submitted in it)"
                + (
                    f"; waiting jobs followed up to {max(r.end_s for r in self.results):.0f} s"
                    if any(r.end_s > r.duration_s for r in self.results)
                    else ""
                )
            )
            lines.append(
                f"offered load over the measured window: {self.offered_load:.2f}x the fleet "
                f"({self.offered_gpu_hours:,.1f} GPU-h of work submitted in it)"
            )
        lines += ["", format_table(self.summaries), ""]
        lines += [f"Jain orgs counted ({s.policy}): {jain_counts(s)}" for s in self.summaries]
        lines += [
            f"Jain over the orgs with demand throughout, the earlier definition ({s.policy}): "
            f"{jain_throughout_cell(s)}"
            for s in self.summaries
        ]
        if self.flood:
            lines += [
                "",
                "| policy | other enterprise p95 wait, no flood (s) | with flood (s) | growth "
                "| jobs |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {f.policy} | {f.p95_without:.1f} | {f.p95_with:.1f} | {f.growth:+.1%} | "
                f"{f.jobs} |"
                for f in self.flood
            ]
        if by_size:
            lines += ["", format_waits_by_size(self.results)]
        if self.plots:
            lines += ["", *[f"plot: {path}" for path in self.plots]]
        return "\n".join(lines)


def build_fleet(gpus: int, fleet_file: str | Path | None) -> FleetModel:
    return fleet_from_file(fleet_file) if fleet_file else synthetic_fleet(gpus)


def build_workload(
    scenario: str,
    fleet: FleetModel,
    duration_s: float,
    seed: int,
    *,
    overload: float = 2.0,
    flood_jobs: int = 10_000,
    trace_path: str | Path | None = None,
    trace_speedup: float | None = None,
    trace_max_work_s: float = 3600.0,
    trace_checkpoint_every_s: float | None = workload.TRACE_CHECKPOINT_EVERY_S,
) -> workload.Workload:
    types, total = fleet.gpu_types, fleet.total_gpus
    largest_node = max((len(gpus) for _, gpus in fleet.nodes), default=0)
    if scenario == "trace":
        if not trace_path:
            raise ValueError("the trace scenario needs a trace CSV (--trace PATH)")
        return workload.trace(
            trace_path,
            types,
            duration_s,
            trace_speedup,
            trace_max_work_s,
            max_gpus_per_job=largest_node,
            checkpoint_every_s=trace_checkpoint_every_s,
        )
    if scenario == "bursty":
        load = workload.bursty(types, total, duration_s, seed, load=overload)
    elif scenario == "steady":
        load = workload.steady(types, total, duration_s, seed, overload)
    elif scenario == "flood":
        load = workload.flood(types, total, duration_s, seed, flood_jobs, overload=overload)
    elif scenario == "spike":
        load = workload.spike(types, total, duration_s, seed, overload=overload)
    else:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    # A job wider than every node would wait for ever: on a small pool (one GPU, or a
    # node of four) the generators' wider jobs take the largest node instead.
    return load.fitted_to(largest_node)


# A trace's default warm-up: 15 % of the run, but never past the submission of this share
# of its jobs, so that a trace whose arrivals come at once (a batch at t = 0) or early is
# measured rather than swallowed by the warm-up.
WARMUP_JOB_SHARE = 0.15


def trace_warmup_s(load: workload.Workload, duration_s: float) -> float:
    """The warm-up of a trace replay: workload.DEFAULT_WARMUP_SHARE of `duration_s`, or less where
    the trace has submitted WARMUP_JOB_SHARE of its jobs before that (0 for a trace
    submitted at once)."""
    submits = sorted(job.submit_at for job in load.jobs)
    if not submits:
        return workload.DEFAULT_WARMUP_SHARE * duration_s
    return min(
        workload.DEFAULT_WARMUP_SHARE * duration_s,
        submits[int(WARMUP_JOB_SHARE * (len(submits) - 1))],
    )


def run_scenario(
    scenario: str,
    policies: list[str],
    *,
    gpus: int = 1000,
    duration_s: float | None = None,
    seed: int = 1,
    fleet_file: str | Path | None = None,
    trace_path: str | Path | None = None,
    trace_speedup: float | None = None,
    trace_max_work_s: float = 3600.0,
    trace_checkpoint_every_s: float | None = workload.TRACE_CHECKPOINT_EVERY_S,
    overload: float | None = None,
    flood_jobs: int = 10_000,
    warmup_s: float | None = None,
    queue_quota: Mapping[str, int | None] | None = None,
    config: PolicyConfig | None = None,
    out_dir: str | Path | None = None,
    drain_s: float | None = None,
    explain_every_s: float = EXPLAIN_EVERY_S,
    progress: Callable[[str], None] | None = None,
) -> ScenarioReport:
    """Run `scenario` under each of `policies`. `overload` is the offered load (work
    submitted over the fleet's GPU time): for the synthetic scenarios it scales the
    arrivals (default 2x, bursty 1x); for a trace it sizes the fleet so that the work
    submitted in the measured window is that many times the fleet (default: the fleet as
    given)."""
    if scenario == "trace" and not fleet_file and trace_path:
        beside = Path(trace_path).with_name(f"{Path(trace_path).stem}-fleet.json")
        fleet_file = beside if beside.exists() else None
    fleet = build_fleet(gpus, fleet_file)
    named: list[str] = []
    if scenario == "trace" and not fleet_file and trace_path:
        named = workload.trace_gpu_types(trace_path)
        if set(named) - {t.name for t in fleet.gpu_types}:
            fleet = fleet_of_types(gpus, named)  # no row dropped for a model we lack
        else:
            named = []
    if overload is None and scenario != "trace":
        overload = 1.0 if scenario == "bursty" else 2.0
    chosen = duration_s is None
    if duration_s is None:
        duration_s = workload.DEFAULT_DURATION_S
        if scenario == "bursty":
            duration_s = workload.bursty_default_duration_s(fleet.total_gpus, overload)
    if warmup_s is not None and warmup_s >= duration_s:
        raise ValueError(
            f"the warm-up ({warmup_s:g} s) must be shorter than the run ({duration_s:g} s)"
        )
    load = build_workload(
        scenario,
        fleet,
        duration_s,
        seed,
        overload=overload,
        flood_jobs=flood_jobs,
        trace_path=trace_path,
        trace_speedup=trace_speedup,
        trace_max_work_s=trace_max_work_s,
        trace_checkpoint_every_s=trace_checkpoint_every_s,
    )
    if chosen and duration_s < workload.DEFAULT_DURATION_S:
        load.notes.append(
            f"{duration_s:.0f} s of arrivals, bursty's default on {fleet.total_gpus:,} GPUs at "
            f"{overload:g}x (about {workload.BURSTY_DEFAULT_REQUESTS:,} requests; --duration "
            "for longer)"
        )
    if warmup_s is None and scenario == "trace":
        warmup_s = trace_warmup_s(load, duration_s)
        if warmup_s < workload.DEFAULT_WARMUP_SHARE * duration_s:
            load.notes.append(
                f"warm-up {warmup_s:.0f} s: the trace submits {WARMUP_JOB_SHARE:.0%} of its "
                "jobs by then (a warm-up never holds more)"
            )
    warmup = workload.DEFAULT_WARMUP_SHARE * duration_s if warmup_s is None else warmup_s
    if scenario == "trace" and overload is not None:
        offered = load.offered_gpu_seconds(warmup, duration_s)
        target = max(1, round(offered / ((duration_s - warmup) * overload)))
        # Every job keeps a node that can hold it, however few GPUs the load asks for.
        needs = {(job.gpu_types, job.gpu_count) for job in load.jobs}
        model = fleet_of_types(8 * len(named), named) if named else fleet
        fleet = model.scaled_to(target, holding=needs)
        load.notes.append(f"fleet sized for {overload:g}x offered load: {fleet.describe()}")
        load.notes += _sizing_caveats(load, fleet, overload, warmup, duration_s)
    if scenario in ("trace", "bursty") and queue_quota is None:
        queue_quota = {}  # a replay of real requests admits everything that was submitted
    if drain_s is None:  # follow a replay's waiting jobs to their starts (bounded)
        drain_s = duration_s if scenario in ("trace", "bursty") else 0.0

    def simulate(work: workload.Workload, name: str) -> SimResult:
        return Simulation(
            fleet,
            work,
            POLICIES[name],
            policy_name=name,
            config=config,
            duration_s=duration_s,
            warmup_s=warmup_s,
            queue_quota=queue_quota,
            drain_s=drain_s,
            explain_every_s=explain_every_s,
            progress=progress,
        ).run()

    results = [simulate(load, name) for name in policies]
    report = ScenarioReport(
        scenario=scenario,
        fleet=fleet,
        notes=load.notes,
        results=results,
        summaries=[summarize(r) for r in results],
        offered_load=load.offered_load(fleet.total_gpus, warmup, duration_s),
        offered_gpu_hours=load.offered_gpu_seconds(warmup, duration_s) / 3600,
        warmup_jobs=sum(1 for job in load.jobs if job.submit_at < warmup),
    )
    if scenario == "flood":
        base = build_workload("steady", fleet, duration_s, seed, overload=overload or 2.0)
        report.baseline_results = [simulate(base, name) for name in policies]
        for flooded, plain in zip(results, report.baseline_results, strict=True):
            report.flood.append(_flood_impact(flooded, plain, load.flood_org, load.flood_at))
    if out_dir is not None:
        report.plots = write_plots(report, Path(out_dir))
    return report


# A trace's offered load may miss --load by rounding to whole nodes; beyond this share
# of the target the run says so.
LOAD_TOLERANCE = 0.1


def _sizing_caveats(
    load: workload.Workload, fleet: FleetModel, overload: float, warmup: float, duration: float
) -> list[str]:
    """What a replay sized by --load should know: the load it got if it is not the one
    asked for (too little work for the smallest fleet that holds every job), and how
    much higher the load is while the trace arrives if its arrivals fill only part of
    the window (the load is taken over the whole measured window)."""
    notes = []
    got = load.offered_load(fleet.total_gpus, warmup, duration)
    if abs(got - overload) > LOAD_TOLERANCE * overload:
        notes.append(
            f"offered load {got:.2f}x, not {overload:g}x: the fleet cannot be sized closer "
            "(it keeps a node for each job shape, in whole nodes)"
        )
    submits = [job.submit_at for job in load.jobs if warmup <= job.submit_at < duration]
    arriving = max(submits) - warmup if submits else 0.0
    if submits and arriving < 0.5 * (duration - warmup):
        # Over at least a minute, the last arrival included. (A window cut to the
        # arrivals is no cure: work submitted near its end runs past it, yet counts whole
        # in the offered load, so the fleet would be sized for more than it gets.)
        end = math.nextafter(warmup + max(arriving, 60.0), math.inf)
        while_arriving = load.offered_load(fleet.total_gpus, warmup, end)
        notes.append(
            f"the trace arrives within {arriving:.0f} s of the {duration - warmup:.0f} s "
            f"measured: {while_arriving:.2f}x "
            + ("while it arrives" if arriving >= 60.0 else "over its first minute")
        )
    return notes


def _flood_impact(flooded: SimResult, plain: SimResult, org: str, at: float) -> FloodImpact:
    def others(record) -> bool:
        return record.tier == "enterprise" and record.org != org and record.submit_at >= at

    with_flood, without = wait_stats(flooded, others), wait_stats(plain, others)
    return FloodImpact(
        policy=flooded.policy, p95_without=without.p95, p95_with=with_flood.p95, jobs=without.count
    )


def write_plots(report: ScenarioReport, out_dir: Path) -> list[Path]:
    from . import plots  # matplotlib is only imported when plots are asked for

    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = report.scenario
    paths = [
        plots.plot_utilisation(report.results, out_dir / f"{prefix}-utilisation.png"),
        plots.plot_wait_cdf(report.results, out_dir / f"{prefix}-wait-cdf.png"),
    ]
    if report.flood and report.results[0].flood_org:
        first = report.results[0]
        paths.append(
            plots.plot_flood_waits(
                list(zip(report.baseline_results, report.results, strict=True)),
                first.flood_org,
                first.flood_at,
                out_dir / "flood-enterprise-waits.png",
            )
        )
    return paths
