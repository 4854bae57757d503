"""Results: storage, the 302 to a signed link, and refusing altered or expired links."""

import json
import sys
from urllib.parse import urlsplit

import pytest
from django.core import signing
from django.test import override_settings

from apps.jobs.models import JobStatus
from apps.jobs.services import results
from tests.jobs.factories import JobFactory, job_with_stored_result, reset_job_state

pytestmark = pytest.mark.django_db

VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8


@pytest.fixture(autouse=True)
def _media(tmp_path, db):
    reset_job_state()
    with override_settings(MEDIA_ROOT=tmp_path / "media"):
        yield tmp_path / "media"


@pytest.fixture
def finished(org, tmp_path):
    return job_with_stored_result(org, directory=tmp_path, content=VIDEO)


def test_store_result_copies_the_file_into_media_root(finished, _media):
    stored = _media / "results" / finished.result_path
    assert stored.read_bytes() == VIDEO
    assert finished.result_path == f"{finished.org_id}/{finished.id}/fox.mp4"


def test_result_redirects_to_a_signed_link_that_serves_the_file(tenant, finished, anonymous):
    response = tenant.get(f"/v1/jobs/{finished.id}/result")
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert location.path.startswith("/v1/results/")

    # The link needs no API key: the signature is the access.
    download = anonymous.get(location.path)
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == VIDEO
    assert "fox.mp4" in download["Content-Disposition"]
    assert download["Content-Type"] == "video/mp4"


def test_the_job_body_carries_the_result_link(tenant, finished):
    body = tenant.get(f"/v1/jobs/{finished.id}").json()
    assert body["result"]["url"].startswith("http") and "/v1/results/" in body["result"]["url"]
    assert body["result"]["expires_at"].endswith("Z")


def test_an_altered_link_is_refused_with_403(tenant, finished, anonymous):
    path = urlsplit(tenant.get(f"/v1/jobs/{finished.id}/result")["Location"]).path
    token = path.rsplit("/", 1)[1]
    payload, signature = token.rsplit(":", 1)
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    for forged in (f"{payload}:{flipped}", f"{payload[:-2]}xx:{signature}", "garbage"):
        response = anonymous.get(f"/v1/results/{forged}")
        assert response.status_code == 403, forged
        assert response.json()["error"]["code"] == "invalid_link"


def test_a_link_for_one_job_cannot_fetch_another(finished, org, anonymous, tmp_path):
    other = JobFactory(org=org, status=JobStatus.SUCCEEDED)
    link = results.signed_result_link(finished)
    assert anonymous.get(link.path).status_code == 200
    # Swap the job id inside the token, keeping the signature: refused.
    payload, signature = link.path.rsplit("/", 1)[1].split(":", 1)
    document = json.loads(signing.b64_decode(payload.encode()))
    document["j"] = str(other.id)
    forged = signing.b64_encode(json.dumps(document, separators=(",", ":")).encode()).decode()
    assert anonymous.get(f"/v1/results/{forged}:{signature}").status_code == 403


def test_an_expired_link_is_gone_410(finished, anonymous):
    expired = results.signed_result_link(finished, ttl_s=-1)
    response = anonymous.get(expired.path)
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "link_expired"
    fresh = results.signed_result_link(finished, ttl_s=60)
    assert anonymous.get(fresh.path).status_code == 200


def test_a_deleted_result_is_gone_410(finished, anonymous):
    link = results.signed_result_link(finished)
    results.storage().delete(finished.result_path)
    assert anonymous.get(link.path).status_code == 410


def test_no_result_yet_is_404(tenant, org):
    job = JobFactory(org=org, status=JobStatus.RUNNING)
    response = tenant.get(f"/v1/jobs/{job.id}/result")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "no_result"
    assert tenant.get(f"/v1/jobs/{job.id}").json()["result"] is None


def test_storage_keys_cannot_escape_the_root(_media):
    store = results.storage()
    for key in ("../etc/passwd", "/abs/path", "a/../../b", ""):
        with pytest.raises(ValueError):
            store.exists(key)


def test_s3_backend_is_selected_by_setting_and_needs_boto3(monkeypatch):
    # boto3 is an optional dependency (the `s3` extra): without it, selecting S3 says so.
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with (
        override_settings(GANTRY_RESULT_STORAGE="s3", GANTRY_S3_BUCKET="outputs"),
        pytest.raises(RuntimeError, match="boto3"),
    ):
        results.storage()
    assert isinstance(results.storage(), results.FileSystemStorage)


def test_a_deleted_result_is_404_from_the_job(tenant, finished):
    results.storage().delete(finished.result_path)
    response = tenant.get(f"/v1/jobs/{finished.id}/result")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "no_result"
