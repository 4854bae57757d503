"""No shared filesystem: a job checkpointed on one host resumes on another from the
checkpoint in the object store (moto's S3 server), and its result is byte-identical to
an uninterrupted run.

Two real Celery workers, one per node, each with a media and scratch root of its own
(and the test process a third): nothing but PostgreSQL, Redis and the store is shared.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from apps.fleet.services import drain_node
from apps.jobs.models import Attempt, ExitClass, Job, JobEvent, JobStatus
from tests.conftest import client_with
from tests.factories import org_key
from tests.jobs.factories import funded_org
from tests.ledger.assertions import assert_ledger_exact
from tests.s3_server import s3_fixture
from tests.worker_harness import ROOT, Beat, WorkerPool, submit_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

s3 = s3_fixture()
NODES = ("e2e-h100", "e2e-a100")


def host_root(pool: WorkerPool, node: str) -> Path:
    return pool.tmp / f"host-{node}"


@pytest.fixture(scope="module")
def hosts(django_db_setup, tmp_path_factory, s3):
    """One worker per node, each on its own filesystem, all on the S3 store."""
    pool = WorkerPool(tmp_path_factory.mktemp("hosts"))
    try:
        started = []
        for node in NODES:
            root = host_root(pool, node)
            (root / "media").mkdir(parents=True)
            (root / "scratch").mkdir()
            env = {
                **s3.env,
                "GANTRY_MEDIA_ROOT": str(root / "media"),
                "GANTRY_SCRATCH_ROOT": str(root / "scratch"),
            }
            started.append(pool.launch(node, extra_env=env))
        for worker in started:
            worker.wait_ready()
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def beat(hosts, s3, settings, tmp_path):
    beat = Beat.over(hosts, settings)
    # The test process (beat, API) is a host of its own too.
    settings.MEDIA_ROOT = tmp_path / "api-media"
    settings.GANTRY_CHECKPOINT_ROOT = tmp_path / "api-media" / "checkpoints"
    settings.GANTRY_SCRATCH_ROOT = tmp_path / "api-scratch"
    s3.settings(settings)
    yield beat
    beat.drain(timeout=20)


def uninterrupted_output(tmp: Path, params: dict) -> bytes:
    """The stand-in run once, start to end, with the same params (at full speed)."""
    (tmp / "out").mkdir(parents=True)
    (tmp / "params.json").write_text(json.dumps({**params, "step_seconds": 0}))
    generator = [sys.executable, "-m", "apps.jobs.standin_generator"]
    subprocess.run(
        [
            *generator,
            "--params",
            str(tmp / "params.json"),
            "--output-dir",
            str(tmp / "out"),
            "--checkpoint-dir",
            str(tmp / "ck"),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return (tmp / "out" / "output.gif").read_bytes()


def test_a_job_checkpointed_on_one_host_resumes_on_another_from_the_store(
    beat, hosts, s3, tmp_path
):
    org = funded_org()
    job = submit_job(
        org, prompt="a heron in the reeds", steps=60, step_seconds=0.05, gpu_types=("H100", "A100")
    )
    stored = f"checkpoints/{job.pk}/checkpoint.json"
    beat.until(
        lambda: Job.objects.get(pk=job.pk).progress >= 0.2 and stored in s3.object_keys(),
        timeout=40,
    )
    first = Attempt.objects.get(job=job)
    host_a = first.node.name
    host_b = next(node for node in NODES if node != host_a)
    victim = next(w for w in hosts.workers if w.node == host_a)

    # Host A is lost with its disk: its worker killed, no new work placed there.
    victim.kill9()
    drain_node(name=host_a)
    lost_at = time.monotonic()
    beat.until(lambda: Job.objects.get(pk=job.pk).is_terminal, timeout=60)
    resumed_after_s = time.monotonic() - lost_at

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, hosts.logs()
    lost, second = job.attempts.order_by("number")
    assert (lost.node.name, lost.exit_class) == (host_a, ExitClass.LOST)
    assert (second.node.name, second.exit_class) == (host_b, ExitClass.SUCCEEDED)
    resumed = JobEvent.objects.get(job=job, to_status=JobStatus.SUCCEEDED).data["resumed_step"]
    assert resumed >= 12, resumed  # not from step 0: at least the 20 % checkpointed on A
    worker_b = next(w for w in hosts.workers if w.node == host_b)
    assert "checkpoint pulled from the store" in worker_b.log()

    # Nothing went through a filesystem: no host has a shared checkpoint folder, and B's
    # working copy went with its scratch folder (removed once the run has reported its
    # end, so a moment after the job is seen succeeded).
    for node in NODES:
        assert not (host_root(hosts, node) / "media" / "checkpoints").exists()
    scratch_b = host_root(hosts, host_b) / "scratch"
    beat.until(lambda: not any(scratch_b.iterdir()), timeout=10)

    # The result, through its link and the store's presigned URL, is byte-identical.
    tenant = client_with(org_key(org))
    link = tenant.get(f"/v1/jobs/{job.pk}/result")
    assert link.status_code == 302
    presigned = client_with(None).get(urlsplit(link["Location"]).path)
    assert presigned.status_code == 302
    with urllib.request.urlopen(presigned["Location"], timeout=10) as download:  # noqa: S310
        output = download.read()
    assert output == uninterrupted_output(tmp_path / "reference", job.params)

    assert_ledger_exact(job)
    print(
        f"\nresumed on {host_b} from step {resumed} of 60, "
        f"{resumed_after_s:.1f} s after {host_a} was lost"
    )
