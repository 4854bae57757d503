"""The simulator: scenarios run to completion under every policy, the engine checks
every decision, results are reproducible, and the CLI writes its report and plots."""

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from apps.core import wakeup
from apps.scheduler.policy import PolicyConfig, Preempt, queue_window, schedule
from apps.scheduler.simulate import (
    POLICIES,
    Simulation,
    SimulationError,
    fleet_from_file,
    jain_index,
    run_scenario,
    summarize,
    synthetic_fleet,
)
from apps.scheduler.simulate.__main__ import main
from apps.scheduler.simulate.engine import WAKE_DEBOUNCE_S
from apps.scheduler.simulate.fleet import fleet_of_types
from apps.scheduler.simulate.metrics import waits_by_size
from apps.scheduler.simulate.workload import JobSpec, OrgSpec, Workload, flood, steady
from apps.scheduler.simulate.workload import trace as trace_workload

TRACE = Path("/work/shared/traces/alibaba-gpu-v2023.csv")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_small_overloaded_cluster_runs_under_every_policy(policy):
    report = run_scenario("steady", [policy], gpus=64, duration_s=900.0, seed=3)
    [summary] = report.summaries
    assert 0.5 < summary.utilisation_while_queued <= 1.0
    assert summary.started > 40
    assert summary.rejected > 0  # 2x overload: the free tier hits its queue quota
    assert summary.waits["enterprise"].count > 0
    if policy != "fair":
        assert summary.preemptions == 0


def test_the_same_seed_gives_the_same_results():
    first = run_scenario("steady", ["fair"], gpus=32, duration_s=300.0, seed=5).summaries[0]
    again = run_scenario("steady", ["fair"], gpus=32, duration_s=300.0, seed=5).summaries[0]
    assert (first.waits, first.jain, first.preemptions, first.lost_gpu_seconds) == (
        again.waits,
        again.jain,
        again.preemptions,
        again.lost_gpu_seconds,
    )


def test_flood_reports_other_enterprise_customers_waits_with_and_without_it():
    report = run_scenario(
        "flood", ["fair"], gpus=48, duration_s=400.0, seed=2, flood_jobs=300, warmup_s=60.0
    )
    [impact] = report.flood
    assert impact.jobs > 0
    assert impact.p95_with >= 0 and impact.p95_without >= 0
    flooded = report.results[0]
    assert sum(1 for r in flooded.jobs if r.tag == "flood") == 300


def test_spike_adds_a_burst_of_arrivals():
    fleet = synthetic_fleet(32)
    plain = steady(fleet.gpu_types, fleet.total_gpus, 600.0, seed=1)
    report = run_scenario("spike", ["fair"], gpus=32, duration_s=600.0, seed=1)
    assert any("spike" in note for note in report.notes)
    assert sum(s.admitted + s.rejected for s in report.summaries) > len(plain.jobs)


GPU_TYPES_OF_FLEET_FILES = {
    "T4": {"memory_gb": 16, "price_per_gpu_hour": 400_000},
    "V100": {"memory_gb": 32, "price_per_gpu_hour": 1_500_000},
    "A100": {"memory_gb": 40, "price_per_gpu_hour": 2_500_000},
}


def write_fleet_file(path, types: list[str], nodes: dict[str, tuple[str, int]]):
    """A GANTRY_FLEET_FILE declaring `types`, with nodes name -> (GPU type, GPUs)."""
    path.write_text(
        json.dumps(
            {
                "gpu_types": {name: GPU_TYPES_OF_FLEET_FILES[name] for name in types},
                "nodes": [
                    {"name": name, "gpus": [{"type": kind}] * count}
                    for name, (kind, count) in nodes.items()
                ],
            }
        )
    )
    return path


def test_a_trace_replays_on_a_fleet_file(tmp_path):
    fleet_file = write_fleet_file(
        tmp_path / "fleet.json", ["T4", "V100"], {"t4-a": ("T4", 4), "v100-a": ("V100", 8)}
    )
    trace = tmp_path / "trace.csv"
    rows = ["submit_s,duration_s,gpu_count,gpu_types,tier,org,user,preemptible"]
    for i in range(60):
        tier = ("enterprise", "paid", "free")[i % 3]
        types = ("", "T4", "V100|T4", "A100")[i % 4]  # A100 is not in the fleet
        rows.append(
            f"{i * 100},{300 + i},{1 + i % 2},{types},{tier},org-{i % 4},u{i % 7},{tier == 'free'}"
        )
    trace.write_text("\n".join(rows) + "\n")
    report = run_scenario(
        "trace", ["fair", "fifo"], fleet_file=fleet_file, trace_path=trace, duration_s=600.0
    )
    assert report.fleet.total_gpus == 12
    assert any("dropped" in note for note in report.notes)
    assert all(s.started > 0 for s in report.summaries)


def test_a_fleet_file_type_without_a_node_draws_no_jobs(tmp_path):
    # The workload is drawn for the fleet's types: a declared type no node has would
    # only make jobs that wait for ever.
    fleet_file = write_fleet_file(tmp_path / "fleet.json", ["T4", "A100"], {"t4-a": ("T4", 2)})
    assert [t.name for t in fleet_from_file(fleet_file).gpu_types] == ["T4"]
    report = run_scenario("bursty", ["fair"], fleet_file=fleet_file, duration_s=1800.0)
    [result] = report.results
    assert all(record.first_start is not None for record in result.jobs)


def test_a_trace_written_by_another_tool_replays_its_usable_rows_and_counts_the_rest(tmp_path):
    # A byte-order mark, headers in another case with spaces, tiers capitalised, flags as
    # 1/yes, a GPU count written as 2.0, a row that is not numbers, a tier nobody knows,
    # and a 16-GPU gang on a fleet of 8-GPU nodes.
    trace = tmp_path / "other.csv"
    rows = [" Submit_s , Duration_s ,GPU_count,gpu_types,Tier,org,user,Preemptible"]
    for i in range(40):
        tier = ("Enterprise", "paid", "FREE")[i % 3]
        rows.append(f"{i * 10},{60 + i},{'2.0' if i % 5 == 0 else 1},,{tier},o{i % 3},,{i % 2}")
    rows += ["oops,12,1,,paid,o1,,yes", "400,30,1,,platinum,o1,,no", "410,30,16,,paid,o1,,yes"]
    trace.write_text("\ufeff" + "\n".join(rows) + "\n", encoding="utf-8")
    report = run_scenario("trace", ["fair"], gpus=16, trace_path=trace, duration_s=600.0)
    (note,) = [n for n in report.notes if n.startswith("trace other.csv")]
    assert "40 jobs" in note, note
    assert "1 dropped (more GPUs than a node has)" in note, note
    assert "2 unusable rows skipped (first: line 42)" in note, note
    assert report.summaries[0].started == 40


def test_a_fraction_of_a_gpu_asks_for_whole_ones_and_a_row_without_gpus_is_skipped(tmp_path):
    # A GPU-sharing cluster's trace: quarter and one-and-a-half GPUs, and a CPU-only task.
    trace = tmp_path / "sharing.csv"
    trace.write_text("submit_s,duration_s,gpu_count\n0,60,0.25\n10,60,1.5\n20,60,0\n30,60,1\n")
    workload = trace_workload(trace, synthetic_fleet(8).gpu_types, duration_s=300.0)
    assert sorted(job.gpu_count for job in workload.jobs) == [1, 1, 2]
    (note,) = workload.notes
    assert "2 asking for a fraction of a GPU given whole ones" in note, note
    assert "1 unusable rows skipped (first: line 4)" in note, note


def test_a_trace_fitted_to_the_window_keeps_every_row_and_a_given_speedup_counts_the_rest(
    tmp_path,
):
    # 4,927 s fitted into 3,600: the division's rounding once put the four last rows,
    # submitted at the very end, just past the window, and they were lost unsaid.
    trace = tmp_path / "end.csv"
    trace.write_text("submit_s,duration_s\n0,30\n2000,30\n" + "4927,30\n" * 4)
    gpu_types = synthetic_fleet(8).gpu_types
    fitted = trace_workload(trace, gpu_types, duration_s=3600.0)
    assert len(fitted.jobs) == 6
    assert max(job.submit_at for job in fitted.jobs) == 3600.0
    assert "time compressed 1.369x" in fitted.notes[0], fitted.notes
    given = trace_workload(trace, gpu_types, duration_s=3600.0, speedup=1.0)
    assert len(given.jobs) == 2
    assert "4 rows after the window left out" in given.notes[0], given.notes


def test_on_a_one_gpu_pool_every_bursty_job_fits_and_starts():
    # The pool of the issue: one node with one H100. The generator's 2-GPU requests and
    # its jobs for the premium type must not ask for what the pool lacks.
    report = run_scenario("bursty", ["fair"], gpus=1)
    assert [t.name for t in report.fleet.gpu_types] == ["H100"]
    [result] = report.results
    assert result.jobs and all(record.first_start is not None for record in result.jobs)
    assert any("given 1" in note for note in report.notes), report.notes


@pytest.mark.parametrize("separator", ["\t", ";"])
def test_a_trace_separated_by_tabs_or_semicolons_replays_like_a_csv(tmp_path, separator):
    trace = tmp_path / "other.txt"
    rows = [["submit_s", "duration_s", "gpu_count", "tier"]]
    rows += [[str(10 * i), "60", str(1 + i % 2), "enterprise"] for i in range(6)]
    trace.write_text("\n".join(separator.join(row) for row in rows) + "\n")
    workload = trace_workload(trace, synthetic_fleet(8).gpu_types, duration_s=300.0)
    assert [(job.gpu_count, job.tier) for job in workload.jobs] == [
        (1 + i % 2, "enterprise") for i in range(6)
    ]


def test_a_trace_of_only_submit_and_duration_runs_as_one_paid_org(tmp_path):
    trace = tmp_path / "bare.csv"
    trace.write_text("submit_s,duration_s\n" + "".join(f"{i},{30 + i}\n" for i in range(20)))
    report = run_scenario("trace", ["fair"], gpus=8, trace_path=trace, duration_s=300.0)
    [summary] = report.summaries
    assert summary.started == 20
    # One org alone: Jain's index is undefined, and the count says why (one org, not none).
    assert summary.jain["paid"] == (None, 1)
    assert summary.jain["enterprise"] == (None, 0)


def test_a_replay_sized_by_load_says_when_the_trace_fills_only_part_of_the_window(tmp_path):
    # 300 one-minute jobs arriving within the first ten minutes of an hour: the fleet is
    # sized over the hour, so while the trace arrives the load is about six times that.
    trace = tmp_path / "early.csv"
    trace.write_text("submit_s,duration_s\n" + "".join(f"{2 * i},60\n" for i in range(300)))
    report = run_scenario(
        "trace", ["fair"], gpus=16, trace_path=trace, duration_s=3600.0, warmup_s=0.0, overload=1.0
    )
    (note,) = [n for n in report.notes if n.startswith("the trace arrives within")]
    assert note == "the trace arrives within 598 s of the 3600 s measured: 6.02x while it arrives"
    assert report.offered_load == pytest.approx(1.0, rel=0.1)
    assert not [n for n in report.notes if n.startswith("offered load")], report.notes


def test_a_trace_too_small_for_the_load_asked_says_the_load_it_got(tmp_path):
    # Two minutes of work cannot be 2x an hour of even the smallest fleet that holds it.
    trace = tmp_path / "tiny.csv"
    trace.write_text("submit_s,duration_s\n0,60\n1000,60\n2000,60\n3000,60\n")
    report = run_scenario(
        "trace", ["fair"], gpus=16, trace_path=trace, duration_s=3600.0, warmup_s=0.0, overload=2.0
    )
    (note,) = [n for n in report.notes if n.startswith("offered load")]
    assert note.startswith(f"offered load {report.offered_load:.2f}x, not 2x"), note
    assert report.offered_load < 0.2


def test_a_batch_submitted_at_once_is_told_its_load_over_the_first_minute(tmp_path):
    trace = tmp_path / "batch.csv"
    trace.write_text("submit_s,duration_s\n" + "0,600\n" * 40)
    report = run_scenario("trace", ["fair"], gpus=16, trace_path=trace, overload=1.0)
    (note,) = [n for n in report.notes if n.startswith("the trace arrives within")]
    assert note.endswith("x over its first minute"), note


def synthetic_trace_script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "synthetic_trace.py"
    spec = importlib.util.spec_from_file_location("synthetic_trace", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_synthetic_traces_replay_whole_in_the_shapes_they_promise(tmp_path):
    script = synthetic_trace_script()
    gpu_types = synthetic_fleet(16).gpu_types  # both types the traces name
    shapes = (
        ("heavy-tenants", 8000, 4, 0.5, {1, 2, 4, 8}),
        ("short-requests", 26_000, 10, 0.3, {1}),
        ("gang-heavy", 1081, 1, 0.15, {1, 2, 4, 8}),
        ("inference-and-training", 12_919, 10, 0.5, {1, 2, 4, 8}),
    )
    for shape, jobs, heavy_orgs, heavy_share, gpu_counts in shapes:
        path = tmp_path / f"{shape}.csv"
        assert script.main([shape, str(path)]) == 0
        again = tmp_path / "again.csv"
        script.main([shape, str(again)])
        assert again.read_bytes() == path.read_bytes()  # seeded
        workload = trace_workload(path, gpu_types, duration_s=3600.0)
        assert len(workload.jobs) == jobs, workload.notes  # nothing dropped
        per_org = Counter(job.org.partition(".")[0] for job in workload.jobs)
        heaviest = sum(n for _, n in per_org.most_common(heavy_orgs))
        assert heaviest / jobs > heavy_share
        assert {job.gpu_count for job in workload.jobs} == gpu_counts


def test_the_short_gangs_trace_is_short_jobs_of_several_gpus_that_never_checkpoint(tmp_path):
    script = synthetic_trace_script()
    path = tmp_path / "short-gangs.csv"
    assert script.main(["short-gangs", str(path)]) == 0
    gpu_types = fleet_of_types(24, ["H100", "A100", "T4"]).gpu_types
    workload = trace_workload(path, gpu_types, duration_s=3600.0, checkpoint_every_s=None)
    jobs = workload.jobs
    assert len(jobs) == 3000, workload.notes  # nothing dropped
    assert {job.gpu_count for job in jobs} == {1, 2, 4}
    assert "asking for a fraction of a GPU" in workload.notes[0]
    assert sum(job.gpu_types == ("T4",) for job in jobs) > 600
    assert sorted(job.work_s for job in jobs)[1500] < 30
    enterprise = [job for job in jobs if job.tier == "enterprise"]
    assert 500 < len(enterprise) < 700 and not any(job.preemptible for job in enterprise)
    assert all(job.checkpoint_every_s is None for job in jobs)


@pytest.mark.skipif(not TRACE.exists(), reason="the shared Alibaba trace is not available")
def test_the_alibaba_trace_replays_on_its_fleet():
    report = run_scenario(
        "trace",
        ["fair"],
        fleet_file=TRACE.with_name("alibaba-gpu-v2023-fleet.json"),
        trace_path=TRACE,
        duration_s=200.0,
        trace_speedup=20_000.0,
    )
    assert report.fleet.total_gpus == 6212
    assert report.summaries[0].started > 0


def _tiny_workload(jobs):
    orgs = [OrgSpec("free-org", "free", 1.0, ("u",)), OrgSpec("ent-org", "enterprise", 1.0, ("e",))]
    return Workload(name="tiny", jobs=jobs, orgs=orgs)


def _on_one_node(jobs, policy, *, policy_name="fair", **options) -> Simulation:
    """`jobs` on one 8-GPU node under `policy`, every job admitted."""
    return Simulation(
        synthetic_fleet(8),
        _tiny_workload(jobs),
        policy,
        policy_name=policy_name,
        queue_quota={},
        **options,
    )


def _job(job_id, tier, gpus, at, work=100.0):
    org, user = ("ent-org", "e") if tier == "enterprise" else ("free-org", "u")
    return JobSpec(
        id=job_id,
        submit_at=at,
        tier=tier,
        org=org,
        user=user,
        gpu_count=gpus,
        max_runtime_s=2 * work,
        work_s=work,
        checkpoint_every_s=30.0,
    )


def test_preemption_stops_the_victim_after_its_grace_and_charges_lost_work():
    # A free job fills the node; an enterprise job arrives and, once past its threshold,
    # preempts it. The victim loses its progress since its last checkpoint (every 30 s)
    # plus the stop delay, re-queues, and both eventually finish.
    config = PolicyConfig(
        tier_floors={"enterprise": 0.0, "paid": 0.0, "free": 0.0},
        tier_ceilings={"enterprise": 1.0, "paid": 1.0, "free": 1.0},
    )
    jobs = [_job("victim", "free", 8, 0.0, work=400.0), _job("urgent", "enterprise", 8, 100.0)]
    sim = _on_one_node(
        jobs,
        POLICIES["fair"],
        config=config,
        duration_s=1200.0,
        warmup_s=0.0,
        stop_delay_s=5.0,
    )
    result = sim.run()
    records = {r.id: r for r in result.jobs}
    assert result.preemptions == 1
    assert records["victim"].preemptions == 1
    assert records["urgent"].first_start >= 100.0 + config.preemption_wait_s["enterprise"]
    assert records["victim"].finished_at is not None and records["urgent"].finished_at
    # Preempted at ~t=106 (started at 1, so 105 s in: last checkpoint at 90 s of
    # progress), stopped 5 s later: about 20 s of 8 GPUs lost.
    assert 8 * 10 <= result.lost_gpu_seconds <= 8 * 30


def test_enterprise_waits_are_also_reported_where_it_could_have_started_at_once():
    # One 8-GPU node. "urgent" arrives while a free job holds the node (it may preempt
    # it): startable at once. "behind" arrives while the enterprise job holds it: not.
    jobs = [
        _job("victim", "free", 8, 0.0, work=400.0),
        _job("urgent", "enterprise", 8, 100.0, work=100.0),
        _job("behind", "enterprise", 8, 150.0, work=50.0),
    ]
    sim = _on_one_node(jobs, POLICIES["fair"], duration_s=1200.0, warmup_s=0.0)
    result = sim.run()
    records = {r.id: r for r in result.jobs}
    assert records["urgent"].startable_at_once
    assert not records["behind"].startable_at_once
    assert not records["victim"].startable_at_once  # only enterprise jobs are assessed
    summary = summarize(result)
    assert summary.startable_waits.count == 1
    urgent_wait = records["urgent"].first_start - 100.0
    assert summary.startable_waits.p95 == pytest.approx(urgent_wait)
    assert summary.waits["enterprise"].count == 2


def test_the_engine_rejects_a_decision_that_breaks_the_cluster():
    def greedy_double_booking(snapshot):
        # Starts a job, then claims the very same GPU for a second job.
        from apps.scheduler.policy import Place

        node = snapshot.nodes[0]
        first, second = snapshot.queued[:2]
        gpu = node.gpus[0].id
        return [
            Place(first.id, node.name, (gpu,), node.gpus[0].type, "test"),
            Place(second.id, node.name, (gpu,), node.gpus[0].type, "test"),
        ]

    jobs = [_job("a", "free", 1, 0.0), _job("b", "free", 1, 0.0)]
    sim = _on_one_node(jobs, greedy_double_booking, policy_name="bad", duration_s=5.0)
    with pytest.raises(SimulationError, match="not free"):
        sim.run()


def test_wake_ups_are_debounced_as_the_platform_debounces_them():
    # Submissions at 0.30, 0.36 and 0.38 s: the first wakes the dispatcher at once (a
    # round 50 ms later, which starts it); the two after that round but within its
    # 100 ms window share one wake-up at the window's end (0.40 s); one at 1.60 s, after
    # a quiet window, wakes it at once again. As wake_dispatcher's Redis keys do.
    assert WAKE_DEBOUNCE_S == wakeup.DEBOUNCE_MS / 1000
    rounds = []

    def recording(snapshot):
        rounds.append((round(snapshot.now, 3), sorted(job.id for job in snapshot.queued)))
        return POLICIES["fair"](snapshot)

    jobs = [
        _job("a", "free", 1, 0.30),
        _job("b", "free", 1, 0.36),
        _job("c", "free", 1, 0.38),
        _job("d", "free", 1, 1.60),
    ]
    _on_one_node(jobs, recording, policy_name="recording", duration_s=3.0).run()
    assert rounds == [(0.35, ["a"]), (0.45, ["b", "c"]), (1.65, ["d"])]


def test_the_engine_rejects_preempting_a_protected_job():
    def eager(snapshot):
        if not snapshot.running:
            return POLICIES["fair"](snapshot)
        victim = snapshot.running[0]
        return [Preempt((victim.id,), (victim.job_id,), victim.node, snapshot.queued[0].id, "t")]

    jobs = [_job("v", "free", 4, 0.0), _job("e", "enterprise", 8, 2.0)]
    sim = _on_one_node(
        jobs,
        eager,
        policy_name="eager",
        config=PolicyConfig(min_runtime_before_preemption_s=60.0),
        duration_s=10.0,
    )
    with pytest.raises(SimulationError, match="protected"):
        sim.run()


def test_the_simulator_lists_the_queue_window_the_dispatcher_reads():
    # Every tick's snapshot lists each user's first jobs (claimed ones too) oldest first,
    # with the backlog of the rest, exactly as `queue_window` cuts the whole queue.
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=0)
    fleet = synthetic_fleet(32)
    load = flood(fleet.gpu_types, fleet.total_gpus, 300.0, seed=4, flood_jobs=200)
    checked = []

    def checking(snapshot):
        everything = sorted(sim.queue.values(), key=lambda job: job.submitted_at)
        window = queue_window(everything, config)
        assert [job.id for job in snapshot.queued] == [job.id for job in window.listed]
        assert snapshot.backlog == window.backlog
        left_out = len(snapshot.queued) < len(everything)
        checked.append((left_out, any(job.claimed_node for job in snapshot.queued)))
        return schedule(snapshot)

    sim = Simulation(
        fleet, load, checking, policy_name="fair", config=config, duration_s=300.0, queue_quota={}
    )
    sim.run()
    assert any(left_out for left_out, _ in checked)
    assert any(claims for _, claims in checked)  # claimed jobs (preempt, reserve) listed too


def test_jain_index_is_one_for_equal_shares_and_falls_with_imbalance():
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([5.0]) is None


def test_summary_of_an_empty_window_is_well_defined():
    report = run_scenario("steady", ["fifo"], gpus=16, duration_s=30.0, seed=1)
    summary = summarize(report.results[0])
    assert summary.lost_fraction == 0.0


def test_the_command_line_prints_the_table_and_writes_plots(tmp_path, capsys):
    out = tmp_path / "plots"
    code = main(
        [
            "--scenario",
            "steady",
            "--gpus",
            "32",
            "--duration",
            "300",
            "--policy",
            "all",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for policy in POLICIES:
        assert f"| {policy} |" in printed
    assert sorted(p.name for p in out.glob("*.png")) == [
        "steady-utilisation.png",
        "steady-wait-cdf.png",
    ]


def test_waits_by_job_size_split_each_tiers_jobs_and_print_on_request(capsys):
    report = run_scenario("bursty", ["fair"], gpus=16, duration_s=600.0, seed=1)
    [result], [summary] = report.results, report.summaries

    by_size = waits_by_size(result)

    for tier in ("enterprise", "paid", "free"):
        of_tier = [stats for (t, _), stats in by_size.items() if t == tier]
        assert sum(stats.count for stats in of_tier) == summary.waits[tier].count
        assert max(stats.max for stats in of_tier) == summary.waits[tier].max
    assert {gpus for _, gpus in by_size} >= {1, 2}
    assert "| fair | paid | 1 |" in report.text(by_size=True)
    assert "GPUs per job" not in report.text()
    assert main(["--scenario", "steady", "--gpus", "32", "--duration", "300", "--by-size"]) == 0
    assert "| fair | enterprise | 1 |" in capsys.readouterr().out


def test_the_command_line_reports_bad_input(capsys):
    assert main(["--scenario", "trace", "--gpus", "8", "--duration", "10"]) == 2
    assert "trace CSV" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--load", "0"], "must be above zero"),
        (["--load", "-1"], "must be above zero"),
        (["--load", "inf"], "must be a finite number"),
        (["--duration", "0"], "must be above zero"),
        (["--duration", "nan"], "must be a finite number"),
        (["--explain-every", "0"], "must be above zero"),
        (["--flood-jobs", "-3"], "must not be negative"),
        (["--warmup", "-1"], "must not be negative"),
        (["--duration", "100", "--warmup", "100"], "must be shorter than --duration"),
        (["--trace-speedup", "0"], "must be above zero"),
    ],
)
def test_the_command_line_refuses_what_cannot_be_simulated(option, says, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "bursty", "--gpus", "8", "--policy", "fair", *option])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_policy_option_changes_the_fair_policy_and_a_bad_one_is_refused(capsys):
    base = ["--scenario", "bursty", "--gpus", "8", "--duration", "120", "--policy", "fair"]
    assert (
        main(
            [
                *base,
                "--policy-option",
                'preemption_wait_s={"enterprise": null, "paid": null, "free": null}',
                "--policy-option",
                "reclaim_wait_s=1e9",  # nor may a tier take back GPUs another borrows
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("| policy")).split("|")
    row = next(line for line in lines if line.startswith("| fair")).split("|")
    preemptions = [cell.strip() for cell in header].index("preemptions")
    assert row[preemptions].strip() == "0"  # preemption is off
    with pytest.raises(SystemExit):
        main([*base, "--policy-option", "no_such_knob=1"])
    assert "bad policy option" in capsys.readouterr().err
    assert main([*base, "--policy-option", "reclaim_wait_s=-1"]) == 2
    assert "reclaim_wait_s" in capsys.readouterr().err
    # A per-tier knob may name only the tiers it changes; an unknown tier is refused.
    assert main([*base, "--policy-option", 'preemption_wait_s={"enterprise": null}']) == 0
    capsys.readouterr()
    assert main([*base, "--policy-option", 'tier_floors={"gold": 0.1}']) == 2
    assert "unknown tier(s) ['gold']" in capsys.readouterr().err


def test_the_queue_is_explained_as_often_as_the_dispatcher_publishes_it_and_decides_the_same():
    fleet = synthetic_fleet(32)
    load = flood(fleet.gpu_types, fleet.total_gpus, 300.0, seed=6, flood_jobs=200)  # a queue
    explained_at = {}

    def run(every):
        explained_at[every] = []

        def counting(snapshot, *, explain=True):
            if explain:
                explained_at[every].append(snapshot.now)
            return POLICIES["fair"](snapshot, explain=explain)

        counting.explains = True
        sim = Simulation(
            fleet, load, counting, policy_name="fair", duration_s=300.0, explain_every_s=every
        )
        return summarize(sim.run())

    every_tick, every_five = run(1.0), run(5.0)
    assert every_five.preemptions == every_tick.preemptions
    assert (every_five.waits, every_five.lost_gpu_seconds) == (
        every_tick.waits,
        every_tick.lost_gpu_seconds,
    )
    gaps = [b - a for a, b in zip(explained_at[5.0], explained_at[5.0][1:], strict=False)]
    assert gaps and min(gaps) >= 5.0 and all(t == int(t) for t in explained_at[5.0])
    assert len(explained_at[1.0]) > 4 * len(explained_at[5.0])


def test_a_long_run_says_where_it_is_on_the_way_and_ends_with_the_same_table():
    lines: list[str] = []
    quiet = run_scenario("bursty", ["fair"], gpus=16, duration_s=600.0, seed=2).summaries[0]
    told = run_scenario(
        "bursty", ["fair"], gpus=16, duration_s=600.0, seed=2, progress=lines.append
    ).summaries[0]
    assert lines == [], "nothing to say before the first 30 s of wall clock"
    assert (told.waits, told.preemptions, told.lost_gpu_seconds) == (
        quiet.waits,
        quiet.preemptions,
        quiet.lost_gpu_seconds,
    )
    # Three whole-node jobs of 100 s in a 150 s window: two still wait when it ends.
    jobs = [_job(f"j{i}", "free", 8, at=0.0) for i in range(3)]
    _on_one_node(
        jobs,
        POLICIES["fair"],
        duration_s=150.0,
        drain_s=300.0,
        progress=lines.append,
        progress_every_s=0.0,
    ).run()
    assert lines[0].startswith("fair: 0 of 150 virtual s, 2 queued, 1 running (")
    assert lines[100].startswith("fair: 100 of 150 virtual s, 1 queued, 1 running (")
    assert (
        "fair: following the waiting jobs, 50 s past the window, 0 queued, 1 running ("
        in (lines[-1])
    )
    assert all(line.endswith(" s of CPU so far)") for line in lines)
