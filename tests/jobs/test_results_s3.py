"""The S3 backend against an S3-compatible server the tests start (moto's server mode):
results round trip, links presigned by the store, keys confined to their prefix, a
missing object answered 404/410, and checkpoints pushed and pulled."""

import urllib.request
from urllib.parse import urlsplit

import pytest

from apps.jobs.services import checkpoints, results
from tests.jobs.factories import job_with_stored_result, reset_job_state
from tests.s3_server import s3_fixture

pytestmark = pytest.mark.django_db

s3 = s3_fixture()

VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 64


@pytest.fixture(autouse=True)
def _on_s3(s3, settings, tmp_path, db):
    reset_job_state()
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GANTRY_CHECKPOINT_ROOT = tmp_path / "media" / "checkpoints"
    s3.settings(settings)
    yield


@pytest.fixture
def finished(org, tmp_path):
    return job_with_stored_result(org, directory=tmp_path, content=VIDEO)


def test_the_s3_backend_is_selected_and_round_trips(s3, tmp_path):
    store = results.storage()
    assert isinstance(store, results.S3Storage)
    source = tmp_path / "a.bin"
    source.write_bytes(VIDEO)
    assert not store.exists("org/job/a.bin")
    store.save("org/job/a.bin", source)
    assert store.exists("org/job/a.bin")
    with store.open("org/job/a.bin") as handle:
        assert handle.read() == VIDEO
    assert s3.object_keys() == ["results/org/job/a.bin"]  # under GANTRY_S3_PREFIX
    assert store.keys("org") == ["org/job/a.bin"]
    source.write_bytes(b"replaced")
    store.save("org/job/a.bin", source)
    with store.open("org/job/a.bin") as handle:
        assert handle.read() == b"replaced"
    store.delete("org/job/a.bin")
    assert not store.exists("org/job/a.bin")
    with pytest.raises(FileNotFoundError):
        store.open("org/job/a.bin")
    assert s3.object_keys() == []


def test_the_result_link_redirects_to_a_url_presigned_by_the_store(s3, tenant, finished, anonymous):
    assert s3.object_keys() == [f"results/{finished.result_path}"]
    response = tenant.get(f"/v1/jobs/{finished.id}/result")
    assert response.status_code == 302
    link = urlsplit(response["Location"])
    assert link.path.startswith("/v1/results/")

    signed = anonymous.get(link.path)
    assert signed.status_code == 302
    presigned = signed["Location"]
    assert presigned.startswith(f"{s3.endpoint_url}/{s3.bucket}/results/")
    assert "X-Amz-Signature=" in presigned and "X-Amz-Expires=" in presigned

    with urllib.request.urlopen(presigned, timeout=10) as download:  # noqa: S310 (test URL)
        assert download.status == 200
        assert download.read() == VIDEO
        assert 'filename="fox.mp4"' in download.headers["Content-Disposition"]


def test_s3_keys_cannot_escape_the_prefix(s3, tmp_path):
    store = results.storage()
    source = tmp_path / "x"
    source.write_bytes(b"x")
    for key in ("../escaped", "a/../../escaped", "/abs/escaped", "..", ""):
        for call in (
            lambda k: store.save(k, source),
            store.exists,
            store.open,
            store.delete,
            lambda k: store.direct_url(k, expires_in=60, filename="x"),
        ):
            with pytest.raises(ValueError):
                call(key)
    assert [key for key in s3.object_keys() if "escaped" in key] == []


def test_a_missing_object_is_404_from_the_job_and_410_from_its_link(
    s3, tenant, finished, anonymous
):
    link = results.signed_result_link(finished)
    s3.client().delete_object(Bucket=s3.bucket, Key=f"results/{finished.result_path}")

    response = tenant.get(f"/v1/jobs/{finished.id}/result")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "no_result"

    gone = anonymous.get(link.path)
    assert gone.status_code == 410
    assert gone.json()["error"]["code"] == "link_expired"


def test_checkpoints_are_pushed_under_their_job_and_pulled_on_another_host(s3, tmp_path):
    job_id = "8a3e6a52-0000-4000-8000-000000000001"
    assert checkpoints.storage_kind() == "s3"  # follows GANTRY_RESULT_STORAGE
    host_a = checkpoints.local_dir(job_id, tmp_path / "a-scratch")
    assert host_a == tmp_path / "a-scratch" / "checkpoint"  # node-local working copy
    (host_a / "shards").mkdir(parents=True)
    (host_a / "checkpoint.json").write_text('{"step": 4}')
    (host_a / "shards" / "0.bin").write_bytes(VIDEO)
    (host_a / ".checkpoint.json.tmp-99").write_text("half written")  # never pushed

    assert checkpoints.push(job_id, host_a) == 2
    assert s3.object_keys("checkpoints/") == [
        f"checkpoints/{job_id}/checkpoint.json",
        f"checkpoints/{job_id}/shards/0.bin",
    ]

    host_b = tmp_path / "b-scratch" / "checkpoint"
    host_b.mkdir(parents=True)
    (host_b / "leftover.json").write_text("from an older attempt")
    assert checkpoints.pull(job_id, host_b) == 2
    assert sorted(p.relative_to(host_b).as_posix() for p in host_b.rglob("*") if p.is_file()) == [
        "checkpoint.json",
        "shards/0.bin",
    ]
    assert (host_b / "checkpoint.json").read_text() == '{"step": 4}'
    assert (host_b / "shards" / "0.bin").read_bytes() == VIDEO

    # A newer checkpoint replaces the stored one; files it no longer has are removed.
    (host_a / "checkpoint.json").write_text('{"step": 9}')
    (host_a / "shards" / "0.bin").unlink()
    assert checkpoints.push(job_id, host_a) == 1
    assert s3.object_keys("checkpoints/") == [f"checkpoints/{job_id}/checkpoint.json"]
    assert checkpoints.pull(job_id, host_b) == 1
    assert (host_b / "checkpoint.json").read_text() == '{"step": 9}'
    assert not (host_b / "shards").exists()

    # No checkpoint stored: the working copy is left as it is.
    fresh = tmp_path / "c" / "checkpoint"
    fresh.mkdir(parents=True)
    assert checkpoints.pull("8a3e6a52-0000-4000-8000-000000000002", fresh) == 0
    assert list(fresh.iterdir()) == []


def test_checkpoints_on_the_filesystem_are_never_copied(s3, settings, tmp_path):
    settings.GANTRY_CHECKPOINT_STORAGE = "filesystem"  # results in S3, checkpoints shared
    job_id = "8a3e6a52-0000-4000-8000-000000000003"
    shared = checkpoints.local_dir(job_id, tmp_path / "scratch")
    assert shared == settings.GANTRY_CHECKPOINT_ROOT / job_id
    shared.mkdir(parents=True)
    (shared / "checkpoint.json").write_text("{}")
    assert checkpoints.push(job_id, shared) == 0
    assert checkpoints.pull(job_id, shared) == 0
    assert (shared / "checkpoint.json").read_text() == "{}"
    assert s3.object_keys(f"checkpoints/{job_id}") == []
