"""`python -m apps.scheduler.simulate`: run a scenario and print the report."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys

from apps.scheduler.policy import PolicyConfig, policy_with

from .engine import EXPLAIN_EVERY_S
from .runner import POLICIES, SCENARIOS, run_scenario
from .workload import TRACE_CHECKPOINT_EVERY_S


def _quota(text: str) -> dict[str, int | None]:
    """Parse `free=2,paid=8,enterprise=none`."""
    quota: dict[str, int | None] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        tier, _, value = part.partition("=")
        if tier not in ("free", "paid", "enterprise") or not value:
            raise argparse.ArgumentTypeError(f"bad quota {part!r}: use TIER=N or TIER=none")
        quota[tier] = None if value.lower() in ("none", "0", "unlimited") else int(value)
    return quota


def _number(text: str, *, whole: bool = False, above_zero: bool = False) -> float:
    """A finite number, not negative (above zero with `above_zero`; an int with `whole`)."""
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise argparse.ArgumentTypeError(f"{text!r}: not {kind}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number")
    if above_zero and not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above zero")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must not be negative")
    return value


# Durations, loads and intervals; a warm-up; a count of jobs.
_positive = functools.partial(_number, above_zero=True)
_non_negative = _number
_job_count = functools.partial(_number, whole=True)


def _policy_option(text: str) -> tuple[str, object]:
    """Parse `NAME=JSON`, a PolicyConfig field and its value (as GANTRY_POLICY takes it)."""
    name, _, value = text.partition("=")
    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    if name not in fields or not value:
        raise argparse.ArgumentTypeError(
            f"bad policy option {text!r}: use NAME=JSON, NAME one of {sorted(fields)}"
        )
    try:
        return name, json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: value is not JSON: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m apps.scheduler.simulate",
        description="Discrete-event simulation of Gantry's GPU scheduling policy.",
    )
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="steady",
        help="steady 2x overload; flood: + one customer's 10,000 jobs; spike: 10x arrivals "
        "for 5 min; bursty: short requests from thousands of tenants in bursts of up to 4x; "
        "trace: replay --trace",
    )
    parser.add_argument(
        "--policy", choices=[*POLICIES, "all"], default="all", help="policy to run (all: each)"
    )
    parser.add_argument("--gpus", type=int, default=1000, help="synthetic fleet size (8/node)")
    parser.add_argument(
        "--duration",
        type=_positive,
        default=None,
        help="virtual seconds of arrivals (default: 3600; bursty on a large fleet: the whole "
        "5 minutes that hold about 60,000 requests, if shorter)",
    )
    parser.add_argument(
        "--warmup", type=_non_negative, default=None, help="default: 15%% of duration"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--load",
        "--overload",
        dest="load",
        type=_positive,
        default=None,
        help="offered load (work submitted / the fleet's GPU time): scales the arrivals "
        "(default 2, bursty 1), or for a trace sizes the fleet (default: the fleet as given)",
    )
    parser.add_argument("--flood-jobs", type=_job_count, default=10_000)
    parser.add_argument(
        "--queue-quota",
        type=_quota,
        default=None,
        help="queued jobs per user and tier, over which submissions are refused "
        "(default free=1,paid=8,enterprise=none; the trace replay admits everything)",
    )
    parser.add_argument(
        "--fleet-file",
        help="a GANTRY_FLEET_FILE JSON instead of --gpus (with --trace, default: the "
        "trace's <name>-fleet.json beside it, if any)",
    )
    parser.add_argument("--trace", help="trace CSV for --scenario trace")
    parser.add_argument("--trace-speedup", type=_positive, default=None, help="default: fit span")
    parser.add_argument(
        "--trace-max-work", type=_positive, default=3600.0, help="cap run times (s)"
    )
    parser.add_argument(
        "--trace-checkpoint-every",
        type=_non_negative,
        default=TRACE_CHECKPOINT_EVERY_S,
        metavar="S",
        help="a trace's preemptible jobs checkpoint every S seconds of progress (0: never), "
        "unless a row's checkpoint_every_s says otherwise (default %(default)g)",
    )
    parser.add_argument(
        "--policy-option",
        type=_policy_option,
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="override a policy knob for the fair policy, as GANTRY_POLICY does "
        '(e.g. \'tier_weights={"enterprise": 6, "paid": 3, "free": 1}\'); repeatable',
    )
    parser.add_argument(
        "--explain-every",
        type=_positive,
        default=EXPLAIN_EVERY_S,
        metavar="S",
        help="explain the queue (start estimates, reasons) at most every S seconds, as the "
        "dispatcher does (GANTRY_QUEUE_STATE_INTERVAL_S; default %(default)g)",
    )
    parser.add_argument("--out", help="directory for PNG plots")
    parser.add_argument(
        "--by-size",
        action="store_true",
        help="also print each run's waits by tier and job size (GPUs per job)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (every 30 s)"
    )
    return parser


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup is not None and args.duration is not None and args.warmup >= args.duration:
        parser.error(f"--warmup {args.warmup:g} must be shorter than --duration {args.duration:g}")
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    try:
        report = run_scenario(
            args.scenario,
            policies,
            gpus=args.gpus,
            duration_s=args.duration,
            seed=args.seed,
            fleet_file=args.fleet_file,
            trace_path=args.trace,
            trace_speedup=args.trace_speedup,
            trace_max_work_s=args.trace_max_work,
            trace_checkpoint_every_s=args.trace_checkpoint_every or None,
            overload=args.load,
            flood_jobs=args.flood_jobs,
            warmup_s=args.warmup,
            queue_quota=args.queue_quota,
            out_dir=args.out,
            config=policy_with(dict(args.policy_option)),
            explain_every_s=args.explain_every,
            progress=None if args.quiet else _progress,
        )
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.text(by_size=args.by_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
