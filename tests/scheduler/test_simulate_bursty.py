"""The simulator on bursty reality: short requests from many tenants, offered load as
asked, every row of a trace kept, waiting jobs followed, estimates scored."""

import statistics

from apps.scheduler.simulate import run_scenario, synthetic_fleet, workload
from apps.scheduler.simulate.workload import bursty, bursty_default_duration_s, trace

HEADER = "submit_s,duration_s,gpu_count,gpu_types,tier,org,user,preemptible"


def test_the_bursty_workload_is_short_requests_from_many_tenants_at_the_load_asked():
    fleet = synthetic_fleet(16)
    load = bursty(fleet.gpu_types, fleet.total_gpus, 3600.0, seed=3, load=1.5)
    works = [job.work_s for job in load.jobs]
    assert 18 <= statistics.median(works) <= 28
    assert len({job.org for job in load.jobs}) >= 150
    offered = load.offered_load(fleet.total_gpus, 540.0, 3600.0)
    assert 1.0 <= offered <= 2.0, offered
    # Bursts: some minutes see no arrivals, others several times the mean.
    per_minute = [0] * 60
    for job in load.jobs:
        per_minute[int(job.submit_at // 60)] += 1
    assert min(per_minute) == 0 and max(per_minute) >= 2 * statistics.mean(per_minute)


def test_the_bursty_warm_up_is_never_empty_however_short_the_run():
    # A first quiet segment (up to 8 minutes) used to fill a short run's warm-up: a
    # 900 s run of seed 1 measured from its first request, on an idle fleet.
    fleet = synthetic_fleet(16)
    for seed in range(1, 21):
        for duration in (300.0, 900.0, 1800.0, 3600.0):
            load = bursty(fleet.gpu_types, fleet.total_gpus, duration, seed=seed)
            assert any(job.submit_at < 0.15 * duration for job in load.jobs), (seed, duration)


def test_a_bursty_run_follows_every_job_to_its_start_and_scores_the_estimates():
    report = run_scenario("bursty", ["fair", "strict"], gpus=16, duration_s=900.0, overload=0.7)
    text = report.text()
    assert "offered load over the measured window" in text
    for summary in report.summaries:
        assert summary.started == summary.admitted  # drained: nobody left waiting
        assert all(stats.still_waiting == 0 for stats in summary.waits.values())
    fair = report.summaries[0]
    assert fair.eta_error is not None and fair.eta_error[2] > 0
    assert fair.jain["free"][0] is not None  # defined although most tenants are small
    assert fair.utilisation_while_queued >= 0.95


def test_a_trace_that_exactly_fills_the_window_keeps_its_last_row(tmp_path):
    path = tmp_path / "trace.csv"
    rows = [HEADER] + [f"{i * 10},30,1,,paid,org-{i % 3},u{i},false" for i in range(11)]
    path.write_text("\n".join(rows) + "\n")
    fleet = synthetic_fleet(8)
    load = trace(path, fleet.gpu_types, duration_s=100.0)
    assert len(load.jobs) == 11
    assert max(job.submit_at for job in load.jobs) == 100.0


def test_load_sizes_the_fleet_of_a_trace(tmp_path):
    path = tmp_path / "trace.csv"
    rows = [HEADER] + [f"{i * 5},60,1,,free,org-{i % 5},u{i % 5},true" for i in range(200)]
    path.write_text("\n".join(rows) + "\n")
    report = run_scenario(
        "trace", ["fifo"], gpus=64, trace_path=path, duration_s=1000.0, overload=2.0
    )
    assert 1.6 <= report.offered_load <= 2.4, report.offered_load
    assert any("sized for 2x" in note for note in report.notes)


def test_a_trace_without_a_fleet_file_keeps_rows_of_every_gpu_model(tmp_path):
    path = tmp_path / "unseen.csv"
    types = ("L4", "H200|L40S", "", "MI300X")
    rows = [HEADER] + [
        f"{i * 10},40,1,{types[i % 4]},paid,org-{i % 3},u{i},true" for i in range(40)
    ]
    path.write_text("\n".join(rows) + "\n")
    report = run_scenario(
        "trace", ["fair"], gpus=16, trace_path=path, duration_s=400.0, overload=1.0
    )
    assert not any("dropped" in note for note in report.notes), report.notes
    assert report.summaries[0].admitted == 40
    assert report.summaries[0].started == 40


def test_a_trace_submitted_at_once_is_measured_from_its_start_on_a_fleet_sized_for_it(tmp_path):
    # All of a batch's rows at t = 0 used to fall in the warm-up: nothing was measured,
    # the offered load over the window was 0 and `--load` sized the fleet to one GPU.
    path = tmp_path / "batch.csv"
    rows = [HEADER] + [f"0,{20 + i % 40},1,,paid,org-{i % 4},u{i % 8},true" for i in range(400)]
    path.write_text("\n".join(rows) + "\n")
    report = run_scenario(
        "trace", ["fifo"], gpus=64, trace_path=path, duration_s=1000.0, overload=1.0
    )
    assert report.warmup_jobs == 0
    assert any("warm-up 0 s" in note for note in report.notes), report.notes
    assert 0.9 <= report.offered_load <= 1.1, report.offered_load
    assert report.fleet.total_gpus >= 10
    summary = report.summaries[0]
    assert summary.waits["paid"].count == 400 and summary.started == 400


def test_a_fleet_sized_for_a_light_trace_still_holds_its_widest_job(tmp_path):
    path = tmp_path / "light.csv"
    rows = [HEADER] + [f"{i * 50},10,1,,paid,org-1,u1,false" for i in range(20)]
    rows.append(f"{500},10,8,,paid,org-1,u1,false")
    path.write_text("\n".join(rows) + "\n")
    report = run_scenario(
        "trace", ["fair"], gpus=64, trace_path=path, duration_s=1000.0, overload=2.0
    )
    assert max(len(gpus) for _, gpus in report.fleet.nodes) == 8
    assert report.summaries[0].started == 21
    assert report.summaries[0].waits["paid"].still_waiting == 0


def test_a_fleet_cut_to_size_keeps_its_mix_of_gpu_models(tmp_path):
    # The synthetic fleet lists its H100 nodes first: cut to 32 GPUs in that order it
    # had no A100, and a trace's A100 jobs waited for ever.
    cut = synthetic_fleet(1000).scaled_to(32)
    assert {kind for _, gpus in cut.nodes for kind in gpus} == {"H100", "A100"}
    path = tmp_path / "a100.csv"
    rows = [HEADER] + [
        f"{i * 5},30,1,{('A100', 'H100', 'A100|H100')[i % 3]},paid,org-{i % 3},u{i},true"
        for i in range(300)
    ]
    path.write_text("\n".join(rows) + "\n")
    report = run_scenario(
        "trace", ["fair"], gpus=1000, trace_path=path, duration_s=1500.0, overload=1.0
    )
    assert report.summaries[0].started == 300


def test_a_large_fleet_runs_bursty_for_the_minutes_that_hold_its_default_requests(monkeypatch):
    # An hour on a small fleet; on a large one, the whole 5 minutes that hold about
    # BURSTY_DEFAULT_REQUESTS requests (60,000: 1,000 GPUs at 2x run 900 s), said in a note.
    assert bursty_default_duration_s(16, 2.0) == 3600.0
    assert bursty_default_duration_s(1000, 1.0) == 1800.0
    assert bursty_default_duration_s(1000, 2.0) == 900.0
    assert bursty_default_duration_s(100_000, 4.0) == 300.0
    monkeypatch.setattr(workload, "BURSTY_DEFAULT_REQUESTS", 2_000)  # 64 GPUs: 900 s
    report = run_scenario("bursty", ["fifo"], gpus=64)
    assert report.results[0].duration_s == 900.0
    assert "900 s of arrivals, bursty's default on 64 GPUs at 1x" in report.text()
    longer = run_scenario("bursty", ["fifo"], gpus=64, duration_s=1200.0)
    assert longer.results[0].duration_s == 1200.0
    assert "bursty's default" not in longer.text()


def test_a_trace_row_may_give_its_own_checkpoint_interval_and_0_means_never(tmp_path):
    path = tmp_path / "checkpoints.csv"
    rows = [f"{HEADER},checkpoint_every_s"] + [
        f"{i},60,1,,free,org-1,u1,true,{every}"
        for i, every in enumerate(("30", "0", "", "-5", "nan", "soon"))
    ]
    rows.append("9,60,1,,paid,org-1,u1,false,30")  # never preempted: nothing to save
    path.write_text("\n".join(rows) + "\n")
    fleet = synthetic_fleet(8)
    load = trace(path, fleet.gpu_types, duration_s=100.0)
    intervals = {job.id: job.checkpoint_every_s for job in load.jobs}
    assert intervals == {"t0": 30.0, "t1": None, "t2": 300.0, "t6": None}
    assert "3 unusable rows skipped (first: line 5)" in load.notes[0], load.notes
    assert (
        "preemptible jobs checkpoint every 300 s (2 with an interval of their own)"
        in (load.notes[0])
    )
    never = trace(path, fleet.gpu_types, duration_s=100.0, checkpoint_every_s=None)
    assert [job.checkpoint_every_s for job in never.jobs] == [30.0, None, None, None]
    assert "preemptible jobs never checkpoint" in never.notes[0]


def test_a_replay_whose_jobs_checkpoint_loses_less_work_to_preemption(tmp_path):
    # Eight free jobs of 10 minutes fill the node; enterprise jobs then preempt them.
    # A trace says nothing of checkpoints: what a preemption costs is the replay's
    # assumption, and it must show in the work lost.
    path = tmp_path / "reclaimed.csv"
    rows = [HEADER] + [f"0,600,1,,free,org-f{i},u1,true" for i in range(8)]
    rows += [f"{100 + 20 * i},60,1,,enterprise,org-e,u1,false" for i in range(8)]
    rows.append("400,1,1,,paid,org-p,u1,false")  # the replay's last submission
    path.write_text("\n".join(rows) + "\n")

    def lost(every):
        report = run_scenario(
            "trace",
            ["fair"],
            gpus=8,
            trace_path=path,
            duration_s=400.0,
            warmup_s=50.0,
            trace_checkpoint_every_s=every,
        )
        return report.summaries[0]

    never, often = lost(None), lost(5.0)
    assert never.preemptions >= 4 and often.preemptions >= 4
    assert never.lost_gpu_seconds >= 100 * never.preemptions  # they ran 100 s and more
    assert often.lost_gpu_seconds <= 10 * often.preemptions  # 5 s apart, plus the stop
