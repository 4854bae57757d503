"""Gantry across hosts: two API hosts, two control hosts, three GPU-worker hosts and a
services host, each a network namespace (tests/multihost/bed.py), nothing shared but
PostgreSQL, Valkey and the object store. Then hosts are lost, as links cut mid-run.

The tests run in order on one platform (module fixture) and each leaves every link up.
"""

from __future__ import annotations

import re
import threading
import time
import uuid

import psycopg
import pytest

from gantry_client.api import TransportError
from gantry_client.cli import submit_with_retry
from tests.multihost.bed import wait_until
from tests.multihost.platform import (
    API_HOSTS,
    CONTROL_HOSTS,
    GPU_HOSTS,
    last_beat_state,
    leading_beat,
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
    for host in GPU_HOSTS:
        # Every log line names the host it comes from; each host is its own Prometheus
        # target; the fleet page's liveness names the node's host.
        records = log_records(platform.log(host, "worker"))
        assert records and {r["host"] for r in records} == {host}
        finished = re.search(
            r'^gantry_runner_attempts_total\{exit_class="succeeded"\} (\S+)$',
            platform.scrape(host),
            re.MULTILINE,
        )
        ran_here = sum(1 for _, _, node, *_ in attempts if node == host)
        assert finished and float(finished.group(1)) == ran_here
        assert platform.pulse(host)["host"] == host
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


def where_they_are(platform, job_ids) -> str:
    """Each job's status, what its queue entry says and its attempts: what a timeout
    message needs for the next reader to tell a slow reaper from a stuck dispatcher."""
    attempts: dict[str, list] = {}
    for job, number, node, _worker, state, exit_class, _started, _finished in attempts_of(
        platform, job_ids
    ):
        attempts.setdefault(job, []).append(f"#{number} {node} {state} {exit_class or ''}".strip())
    lines = []
    for job in job_ids:
        body = platform.job(job)
        lines.append(
            f"{job}: {body['status']}, queue {body.get('queue')}, attempts {attempts.get(job, [])}"
        )
    return "; ".join(lines)


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
        except AssertionError as timeout:
            raise AssertionError(f"{timeout}; {where_they_are(platform, job_ids)}") from timeout
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
        if "no lease renewal accepted" in r.get("msg", "") and "generator killed" in r["msg"]
    }
    resumed_steps, margins = [], []
    for job, stale_attempt in lost.items():
        runs = [a for a in attempts if a[0] == job]
        assert [a[1] for a in runs] == [1, 2]  # lost once, run again once: no double run
        first, second = runs
        assert first[2] == lost_host and first[4] == "finished"
        assert second[2] != lost_host and second[5] == "succeeded"
        # The stale run killed its generator before the job started elsewhere.
        assert stale_attempt in fenced, f"no fence of {stale_attempt} in {lost_host}'s log"
        margins.append(second[6].timestamp() - fenced[stale_attempt])
        assert margins[-1] > 0, f"the stale run was killed {-margins[-1]:.2f} s too late"
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
        f"from steps {sorted(resumed_steps)} of 48; the stale generators were killed "
        f"{min(margins):.1f} s or more before their jobs started elsewhere; "
        f"jobs lost 0, double runs 0, reconciler violations 0"
    )


def first_record(platform, host: str, name: str, text: str, *, after: float) -> float | None:
    """When `host`'s `name` process first logged `text` after `after` (unix time)."""
    for record in log_records(platform.log(host, name)):
        if text in record.get("msg", "") and wall_clock_of(record) > after:
            return wall_clock_of(record)
    return None


def test_control_host_cut_off_the_other_takes_over_dispatch_and_the_periodic_tasks(platform):
    leader = leading_beat(platform)
    standby = next(host for host in CONTROL_HOSTS if host != leader)
    cut_at = time.time()
    platform.bed.hosts[leader].cut()
    try:
        job = platform.submit("api-1", prompt="after the cut", steps=4, step_seconds=0.25)
        job_id = job.data["id"]
        took_over = wait_until(
            lambda: first_record(platform, standby, "beat", "beat leads", after=cut_at),
            what=f"{standby}'s beat leading",
            timeout=30,
            check=platform.check_alive,
        )
        platform.wait_jobs([job_id], "succeeded", timeout=60)
        placed_at = attempts_of(platform, [job_id])[0][6].timestamp()
    finally:
        restored_at = time.time()
        platform.bed.hosts[leader].restore()
    # The old leader, back, finds its session ended and follows; it sends nothing more.
    wait_until(
        lambda: last_beat_state(platform, leader) == "follows",
        what=f"{leader}'s beat following",
        timeout=30,
        check=platform.check_alive,
    )
    time.sleep(3)
    assert leading_beat(platform) == standby
    sent_late = [
        r
        for r in log_records(platform.log(leader, "beat"))
        if "Sending due task" in r.get("msg", "") and wall_clock_of(r) > restored_at
    ]
    assert sent_late == []
    # No tick applied twice: each attempt was placed by exactly one applied decision.
    doubles = platform.sql(
        "SELECT attempt_id FROM scheduler_dispatchdecision WHERE kind = 'place'"
        " AND outcome = 'applied' GROUP BY attempt_id HAVING count(*) > 1"
    )
    unplaced = platform.sql(
        "SELECT count(*) FROM jobs_attempt a WHERE NOT EXISTS (SELECT 1 FROM"
        " scheduler_dispatchdecision d WHERE d.attempt_id = a.id AND d.kind = 'place'"
        " AND d.outcome = 'applied')"
    )[0][0]
    assert doubles == [] and unplaced == 0
    assert_ledger_reconciles(platform)
    platform.figures.append(
        f"control host lost: {standby}'s beat led {took_over - cut_at:.1f} s after the cut, "
        f"a job submitted after the cut was placed {placed_at - cut_at:.1f} s after it "
        "(its submission woke the standby's control worker) "
        f"(lock idle timeout {platform.env['GANTRY_LOCK_IDLE_TIMEOUT_S']} s); "
        f"ticks applied twice 0, reconciler violations 0"
    )


def test_api_host_cut_off_a_client_retrying_on_the_other_with_the_same_key_gets_the_same_job(
    platform,
):
    api_1, gateway = platform.bed.hosts["api-1"], platform.bed.gateway
    spec = platform.spec(prompt="answer lost", steps=2, step_seconds=0.1)
    key = "retry-" + uuid.uuid4().hex
    # 1. api-1 commits the job but its answer never reaches the client: the submission
    # is held on its idempotency lock while api-1's replies are cut, then let through.
    # The submission's lock (apps.jobs.services.admission), on the key as stored.
    lock = f"job-submit|{platform.org_id}|project:{platform.project_id}:{key}"
    outcome = {}
    with psycopg.connect(platform.database_url.replace("postgres://", "postgresql://")) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [lock])

        def submit_to_api_1():
            try:
                outcome["answer"] = platform.api("api-1", timeout=6).submit_job(
                    spec, idempotency_key=key
                )
            except TransportError as exc:
                outcome["error"] = exc

        client = threading.Thread(target=submit_to_api_1)
        client.start()
        wait_until(
            lambda: platform.sql(
                "SELECT 1 FROM pg_stat_activity WHERE client_addr = %s::inet AND wait_event_type ="
                " 'Lock' AND query LIKE '%%advisory%%'",
                [api_1.address],
            ),
            what="api-1 waiting on the submission's lock",
            timeout=20,
        )
        api_1.drop_replies_to(gateway)
        conn.commit()  # the lock goes: api-1 commits the job and answers into the void
    try:
        client.join(timeout=30)
        assert "error" in outcome, outcome  # the client heard nothing
        retried = platform.api("api-2").submit_job(spec, idempotency_key=key)
    finally:
        api_1.deliver_to(gateway)
    created = platform.sql("SELECT id::text FROM jobs_job WHERE params->>'prompt' = 'answer lost'")
    assert [row[0] for row in created] == [retried.data["id"]]  # one job, the same
    assert retried.replayed

    # 2. api-1 down altogether: the client (given both hosts, as `gantry --api-url
    # a,b submit` is) gets no answer from api-1 and resends to api-2 with the same key.
    spec = platform.spec(prompt="host down", steps=2, step_seconds=0.1)
    key = "retry-" + uuid.uuid4().hex
    api_1.cut()
    try:
        second, answered_by = submit_with_retry(
            platform.api("api-1", timeout=3),
            spec,
            key=key,
            retries=0,
            others=[platform.api("api-2")],
        )
        again = platform.api("api-2").submit_job(spec, idempotency_key=key)
    finally:
        api_1.restore()
    assert answered_by.base_url == platform.api_url("api-2")
    assert again.data["id"] == second.data["id"] and again.replayed
    platform.wait_jobs([retried.data["id"], second.data["id"]], "succeeded", timeout=60)
    assert_ledger_reconciles(platform)
    platform.figures.append(
        "API host lost: an answer lost after api-1 committed, and api-1 down (the client, "
        "given both hosts, resent to api-2 by itself): the retry on api-2 with the same "
        "Idempotency-Key got the same job (1 job each, none held twice)"
    )
