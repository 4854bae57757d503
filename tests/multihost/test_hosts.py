"""Gantry across hosts: two API hosts, two control hosts, three GPU-worker hosts and a
services host, each a network namespace (tests/multihost/bed.py), nothing shared but
PostgreSQL, Valkey and the object store. Then hosts are lost, as links cut mid-run.

The tests run in order on one platform (module fixture) and each leaves every link up.
"""

from __future__ import annotations

import time

import pytest

from tests.multihost.bed import wait_until
from tests.multihost.platform import (
    API_HOSTS,
    GPU_HOSTS,
    log_records,
    wall_clock_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.multihost]


def attempts_of(platform, job_ids) -> list[tuple]:
    """(job, number, node, worker, state, exit_class, started_at, finished_at) per attempt."""
    return platform.sql(
        "SELECT a.job_id::text, a.number, n.name, a.worker, a.state, a.exit_class,"
        " a.started_at, a.finished_at FROM jobs_attempt a JOIN scheduler_node n"
        " ON n.id = a.node_id WHERE a.job_id::text = ANY(%s) ORDER BY a.job_id, a.number",
        [list(job_ids)],
    )


def assert_ledger_reconciles(platform) -> None:
    assert "no violations" in platform.reconcile()
    open_holds = platform.sql(
        "SELECT count(*) FROM ledger_hold h JOIN jobs_job j ON j.hold_id = h.id"
        " WHERE j.status IN ('succeeded','failed','cancelled','timed_out')"
        " AND h.state = 'active'"
    )[0][0]
    assert open_holds == 0


def test_jobs_submitted_through_both_api_hosts_run_on_all_three_worker_hosts(platform):
    job_ids = []
    for number in range(12):
        host = API_HOSTS[number % 2]
        answer = platform.submit(host, prompt=f"spread {number}", steps=8, step_seconds=0.25)
        assert answer.status == 202
        job_ids.append(answer.data["id"])
    platform.wait_jobs(job_ids, "succeeded", timeout=120)

    attempts = attempts_of(platform, job_ids)
    nodes = {node for _, _, node, *_ in attempts}
    workers = {worker.split(":")[0] for _, _, _, worker, *_ in attempts}
    assert nodes == set(GPU_HOSTS)
    # Each node's runs were made by the worker on that node's own host.
    assert workers == {f"{host}@{host}" for host in GPU_HOSTS}
    assert len(attempts) == len(job_ids)  # none ran twice
    assert_ledger_reconciles(platform)
    platform.figures.append(
        f"spread: 12 jobs through {len(API_HOSTS)} API hosts ran on {len(nodes)} worker hosts"
    )


def resumed_step(platform, job_id: str) -> int:
    """The step the job's last resume started from (its event log), 0 if none."""
    rows = platform.sql(
        "SELECT (data->>'resumed_step')::int FROM jobs_jobevent WHERE job_id::text = %s"
        " AND data ? 'resumed_step' ORDER BY at DESC LIMIT 1",
        [job_id],
    )
    return rows[0][0] if rows else 0


def running_attempts(platform, job_ids) -> dict[str, tuple[str, str, int]]:
    """job -> (node, attempt id, number) of its attempt that is running now."""
    rows = platform.sql(
        "SELECT a.job_id::text, n.name, a.id::text, a.number FROM jobs_attempt a"
        " JOIN scheduler_node n ON n.id = a.node_id"
        " WHERE a.job_id::text = ANY(%s) AND a.state = 'running'",
        [list(job_ids)],
    )
    return {job: (node, attempt, number) for job, node, attempt, number in rows}


def test_worker_host_cut_mid_run_its_jobs_resume_elsewhere_and_its_stale_runs_write_nothing(
    platform,
):
    # Six runs of the same params fill the six GPUs; those on the cut host are resumed
    # elsewhere, the others are the uninterrupted runs their output must equal.
    job_ids = [
        platform.submit(API_HOSTS[n % 2], prompt="a lighthouse", steps=48, step_seconds=0.25).data[
            "id"
        ]
        for n in range(6)
    ]
    wait_until(
        lambda: (
            len(running_attempts(platform, job_ids)) == 6
            and all(platform.job(j)["progress"] >= 0.15 for j in job_ids)
        ),
        what="six runs past their first checkpoints",
        timeout=60,
        check=platform.check_alive,
        every=0.3,
    )
    before = running_attempts(platform, job_ids)
    lost_host = before[job_ids[0]][0]
    lost = {job: attempt for job, (node, attempt, _) in before.items() if node == lost_host}
    cut_at = time.time()
    platform.bed.hosts[lost_host].cut()
    try:
        wait_until(
            lambda: all(
                job in now and now[job][0] != lost_host
                for now in [running_attempts(platform, list(lost))]
                for job in lost
            ),
            what="the lost host's jobs running again elsewhere",
            timeout=60,
            check=platform.check_alive,
            every=0.2,
        )
        resumed_after = time.time() - cut_at
        platform.wait_jobs(job_ids, "succeeded", timeout=120)
    finally:
        platform.bed.hosts[lost_host].restore()
    time.sleep(4)  # the stale worker is back on the network: give it time to misbehave

    attempts = attempts_of(platform, job_ids)
    worker_log = log_records(platform.log(lost_host, "worker"))
    fenced = {
        r.get("attempt_id") or r.get("attempt"): wall_clock_of(r)
        for r in worker_log
        if "no lease renewal accepted" in r.get("msg", "")
    }
    resumed_steps = []
    for job, stale_attempt in lost.items():
        runs = [a for a in attempts if a[0] == job]
        assert [a[1] for a in runs] == [1, 2]  # lost once, run again once: no double run
        first, second = runs
        assert first[2] == lost_host and first[4] == "finished"
        assert second[2] != lost_host and second[5] == "succeeded"
        # The stale run killed its generator before the job started elsewhere.
        assert stale_attempt in fenced, f"no fence of {stale_attempt} in {lost_host}'s log"
        assert fenced[stale_attempt] < second[6].timestamp()
        resumed_steps.append(resumed_step(platform, job))
        assert resumed_steps[-1] >= 0.15 * 48  # from its checkpoint, not from step 0
    # After the fence, the stale worker wrote nothing for those attempts: no checkpoint
    # push, no finish (each attempt ended exactly as the reaper ended it).
    for record in worker_log:
        if record.get("attempt_id") in lost and "pushed to the store" in record.get("msg", ""):
            assert wall_clock_of(record) < fenced[record["attempt_id"]]
    assert not any("ended" in r.get("msg", "") and r.get("attempt_id") in lost for r in worker_log)
    reference = platform.result_bytes(next(j for j in job_ids if j not in lost))
    for job in lost:
        assert platform.result_bytes(job) == reference  # byte-identical after the resume
    assert_ledger_reconciles(platform)
    platform.figures.append(
        f"worker host lost: {len(lost)} running jobs resumed on other hosts "
        f"{resumed_after:.1f} s after the cut (lease {platform.env['GANTRY_LEASE_S']} s), "
        f"from steps {sorted(resumed_steps)} of 48; "
        f"jobs lost 0, double runs 0, reconciler violations 0"
    )
