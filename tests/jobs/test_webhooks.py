"""Webhooks: target checks, signatures verified by a real local HTTP server, retries with
backoff, and one end-to-end delivery through a real Celery worker."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.test import override_settings

from apps.jobs.models import Job, JobEvent, JobStatus
from apps.jobs.services import webhooks
from apps.jobs.services.outcomes import end_job
from apps.jobs.services.webhooks import (
    UnsafeWebhookTarget,
    check_target,
    destination_addresses,
    verify_signature,
)
from apps.ledger.models import Hold
from tests import worker_harness as harness
from tests.conftest import client_with
from tests.factories import org_key
from tests.jobs.factories import JobFactory, funded_org, reset_job_state, spec_body, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]

ROOT = Path(__file__).resolve().parents[2]
LOCAL_HOOKS = {
    "GANTRY_WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    "GANTRY_WEBHOOK_ALLOW_HTTP": True,
}


class HookServer:
    """A real HTTP endpoint on 127.0.0.1 answering scripted statuses, recording requests."""

    def __init__(self, statuses=(200,), delay_s: float = 0.0):
        self.statuses = list(statuses)
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.arrived = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with server.arrived:
                    server.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "at": time.monotonic(),
                        }
                    )
                    status = (
                        server.statuses.pop(0) if len(server.statuses) > 1 else server.statuses[0]
                    )
                    server.arrived.notify_all()
                if server.delay_s:
                    time.sleep(server.delay_s)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/hooks/gantry?src=test"

    def wait_for(self, count: int, timeout: float) -> list[dict]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= count, timeout=timeout)
            return list(self.requests)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def finished_job(org, url: str, status=JobStatus.SUCCEEDED):
    job = JobFactory(org=org, status=JobStatus.RUNNING, webhook_url=url)
    return end_job(job.id, to=status, reason="done", actor="test")


def assert_signed_job_body(request: dict, org, job) -> dict:
    secret = webhooks.webhook_secret(org.id)
    assert verify_signature(secret, request["body"], request["headers"]["X-Gantry-Signature"])
    assert not verify_signature(
        webhooks.webhook_secret(uuid.uuid4()),
        request["body"],
        request["headers"]["X-Gantry-Signature"],
    )
    assert not verify_signature(
        secret, request["body"] + b" ", request["headers"]["X-Gantry-Signature"]
    )
    body = json.loads(request["body"])
    assert body["id"] == str(job.id) and body["status"] == job.status
    assert request["headers"]["X-Gantry-Event"] == f"job.{job.status}"
    assert request["headers"]["X-Gantry-Delivery"] == f"{job.id}.{job.status}"
    assert request["path"] == "/hooks/gantry?src=test"
    return body


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://localhost/hook",
        "https://10.0.0.8/hook",
        "https://172.16.5.4/hook",
        "https://192.168.1.1/hook",
        "https://169.254.169.254/latest/meta-data/",
        "https://100.64.0.1/hook",
        "https://[::1]/hook",
        "https://[fd00::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://0.0.0.0/hook",
        "http://93.184.216.34/hook",
        "https://user:pw@93.184.216.34/hook",
        "https://no-such-host.invalid/hook",
        "gopher://93.184.216.34/hook",
    ],
)
def test_unsafe_webhook_targets_are_refused(url):
    with pytest.raises(UnsafeWebhookTarget) as refused:
        check_target(url)
    assert refused.value.field == "webhook_url"


def test_public_https_targets_and_allowed_hosts_pass():
    target = check_target("https://93.184.216.34:8443/in?x=1")
    assert (target.host, target.port, target.path) == ("93.184.216.34", 8443, "/in?x=1")
    with override_settings(**LOCAL_HOOKS):
        assert check_target("http://127.0.0.1:9/hook").address == "127.0.0.1"
    with (
        override_settings(GANTRY_WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"]),
        pytest.raises(UnsafeWebhookTarget, match="https"),
    ):
        check_target("http://127.0.0.1:9/hook")


def teredo(server: str, client: str) -> str:
    """A Teredo address (2001::/32) naming `server` and, obfuscated, `client`."""
    obfuscated_client = int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    server_bits = int(ipaddress.IPv4Address(server))
    value = (0x2001_0000 << 96) | (server_bits << 64) | (0x8000_63BF << 32) | obfuscated_client
    return str(ipaddress.IPv6Address(value))


TEREDO_TO_LOOPBACK = teredo(server="65.54.227.120", client="127.0.0.1")


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("::7f00:1", id="compatible-form-of-loopback-in-hex"),
        pytest.param("::127.0.0.1", id="compatible-form-of-loopback"),
        pytest.param("::a9fe:a9fe", id="compatible-form-of-the-metadata-address"),
        pytest.param("64:ff9b::a9fe:a9fe", id="nat64-form-of-the-metadata-address"),
        pytest.param("64:ff9b::127.0.0.1", id="nat64-form-of-loopback"),
        pytest.param("64:ff9b:1:a9fe:a9:fe00::", id="local-use-nat64-form-of-metadata"),
        pytest.param("::ffff:127.0.0.1", id="mapped-form-of-loopback"),
        pytest.param("::ffff:10.0.0.1", id="mapped-form-of-a-private-address"),
        pytest.param("2002:7f00:1::", id="6to4-form-of-loopback"),
        pytest.param("2002:a9fe:a9fe::1", id="6to4-form-of-the-metadata-address"),
        pytest.param(TEREDO_TO_LOOPBACK, id="teredo-with-a-loopback-client"),
        pytest.param("fe80::1%eth0", id="link-local-with-a-zone-index"),
        pytest.param("2606:4700:4700::1111%eth0", id="public-address-tied-to-a-link"),
        pytest.param("fec0::1", id="deprecated-site-local"),
        pytest.param("::", id="unspecified"),
        pytest.param("::1", id="loopback"),
    ],
)
def test_ipv6_forms_of_internal_addresses_are_refused(address):
    assert not webhooks._address_is_public(address)
    if "%" not in address:
        # The same address as a URL literal is refused at submission for that reason.
        with pytest.raises(UnsafeWebhookTarget, match="non-public address") as refused:
            check_target(f"https://[{address}]/hook")
        assert refused.value.field == "webhook_url"


def test_a_link_local_url_literal_with_a_zone_index_is_refused_as_non_public():
    with pytest.raises(UnsafeWebhookTarget, match="non-public address"):
        check_target("https://[fe80::1%lo]/hook")


def test_a_resolved_address_carrying_a_zone_index_is_refused(monkeypatch):
    # getaddrinfo hands the zone back as the sockaddr's scope id, apart from the address.
    def resolve_with_zone(host, port, *args, **kwargs):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2606:4700:4700::1111", port, 0, 1))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve_with_zone)
    with pytest.raises(UnsafeWebhookTarget, match="non-public address"):
        check_target("https://hooks.example/hook")


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("2606:4700:4700::1111", id="public-ipv6"),
        pytest.param("64:ff9b::808:808", id="nat64-form-of-a-public-ipv4"),
        pytest.param("::ffff:8.8.8.8", id="mapped-form-of-a-public-ipv4"),
    ],
)
def test_public_ipv6_targets_and_public_ipv4_behind_nat64_or_mapping_are_accepted(address):
    assert webhooks._address_is_public(address)
    target = check_target(f"https://[{address}]/hook")
    assert ipaddress.ip_address(target.address) == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    ("address", "carried"),
    [
        pytest.param("::ffff:127.0.0.1", {"127.0.0.1"}, id="mapped"),
        pytest.param("::a9fe:a9fe", {"169.254.169.254"}, id="compatible"),
        pytest.param("64:ff9b::a9fe:a9fe", {"169.254.169.254"}, id="nat64-well-known"),
        # RFC 6052 /48 layout: the IPv4 is split around the "u" octet (bits 64-71).
        pytest.param("64:ff9b:1:a9fe:a9:fe00::", {"169.254.169.254"}, id="nat64-local-use"),
        pytest.param("2002:a9fe:a9fe::1", {"169.254.169.254"}, id="6to4"),
        pytest.param(TEREDO_TO_LOOPBACK, {"65.54.227.120", "127.0.0.1"}, id="teredo"),
    ],
)
def test_every_ipv4_address_an_ipv6_form_carries_is_checked(address, carried):
    found = {str(ip) for ip in destination_addresses(address) if ip.version == 4}
    assert carried <= found


def test_an_ipv6_form_of_loopback_in_a_submission_is_400_and_holds_nothing(tenant, project):
    response = submit(tenant, spec_body(project="video", webhook_url="https://[::7f00:1]/"))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "webhook_url", error
    assert "webhook_url" in error["message"] and "non-public" in error["message"]
    assert not Job.objects.exists() and not Hold.objects.exists()


def test_a_stored_ipv6_form_of_loopback_is_refused_at_delivery(org, monkeypatch):
    # Stored before the check knew the form: delivery checks again and sends nothing.
    job = finished_job(org, "https://[::7f00:1]/hook")

    def must_not_send(*args, **kwargs):
        raise AssertionError("delivery connected to a refused target")

    monkeypatch.setattr(webhooks, "post_signed", must_not_send)
    outcome = webhooks.deliver_job_webhook(job.id, try_number=1)
    assert not outcome.delivered and outcome.retry_in is None
    assert "non-public" in outcome.detail
    assert JobEvent.objects.filter(job=job, data__webhook="refused").exists()


def test_an_org_reads_its_webhook_secret(org, operator):
    tenant = client_with(org_key(org))
    body = tenant.get("/v1/webhooks/secret").json()
    assert body["secret"] == webhooks.webhook_secret(org.id)
    assert body["secret"] != webhooks.webhook_secret(funded_org().id)
    assert body["signature_header"] == "X-Gantry-Signature"
    assert operator.get("/v1/webhooks/secret").status_code == 403


@override_settings(**LOCAL_HOOKS)
def test_a_failed_delivery_is_retried_with_backoff_then_delivered_signed(org):
    with HookServer(statuses=[500, 200]) as server:
        job = finished_job(org, server.url)

        first = webhooks.deliver_job_webhook(job.id, try_number=1)
        assert not first.delivered and first.retry_in > 0 and first.detail == "HTTP 500"
        second = webhooks.deliver_job_webhook(job.id, try_number=2)
        assert second.delivered and second.retry_in is None
        # Delivered once for good: a duplicate task run sends nothing more.
        third = webhooks.deliver_job_webhook(job.id, try_number=1)
        assert not third.delivered and third.retry_in is None

        requests = server.wait_for(2, timeout=5)
    assert len(requests) == 2
    for request in requests:
        assert_signed_job_body(request, org, job)
    note = JobEvent.objects.get(job=job, data__webhook="delivered")
    assert note.data["tries"] == 2 and note.from_status == note.to_status == "succeeded"


@override_settings(**LOCAL_HOOKS, GANTRY_WEBHOOK_MAX_TRIES=2, GANTRY_WEBHOOK_TIMEOUT_S=0.3)
def test_a_slow_endpoint_times_out_and_delivery_gives_up_after_the_last_try(org):
    with HookServer(statuses=[200], delay_s=1.0) as server:
        job = finished_job(org, server.url, status=JobStatus.FAILED)
        first = webhooks.deliver_job_webhook(job.id, try_number=1)
        # Cut off by the delivery timeout, not waiting out the endpoint's silence.
        assert "timed out" in first.detail
        assert not first.delivered and first.retry_in is not None
        last = webhooks.deliver_job_webhook(job.id, try_number=2)
        assert not last.delivered and last.retry_in is None
    assert JobEvent.objects.filter(job=job, data__webhook="gave_up").count() == 1


def test_backoff_grows_exponentially_up_to_the_cap():
    with override_settings(GANTRY_WEBHOOK_BACKOFF_BASE_S=2, GANTRY_WEBHOOK_BACKOFF_MAX_S=20):
        delays = [webhooks.backoff_s(n) for n in range(1, 7)]
    assert 1.6 <= delays[0] <= 2.4 and 3.2 <= delays[1] <= 4.8 and 6.4 <= delays[2] <= 9.6
    assert all(16 <= d <= 24 for d in delays[4:])


def test_the_target_is_checked_again_at_delivery(org):
    with HookServer() as server:
        with override_settings(**LOCAL_HOOKS):
            job = finished_job(org, server.url)
        # The allow-list no longer names the host: nothing is sent, nothing retried.
        with override_settings(GANTRY_WEBHOOK_ALLOW_HTTP=True):
            outcome = webhooks.deliver_job_webhook(job.id, try_number=1)
        assert not outcome.delivered and outcome.retry_in is None
        assert server.requests == []
    assert JobEvent.objects.filter(job=job, data__webhook="refused").exists()


def test_non_terminal_jobs_and_jobs_without_hooks_send_nothing(org):
    running = JobFactory(org=org, status=JobStatus.RUNNING, webhook_url="https://x.test/h")
    quiet = JobFactory(org=org, status=JobStatus.SUCCEEDED)
    for job in (running, quiet):
        outcome = webhooks.deliver_job_webhook(job.id, try_number=1)
        assert not outcome.delivered and outcome.retry_in is None


# --- end to end through a real Celery worker -------------------------------------------


@pytest.fixture
def control_worker(transactional_db, tmp_path):
    """A control-queue worker that may deliver to this machine's test hook server."""
    worker = harness.control_worker(
        tmp_path,
        extra_env={
            "GANTRY_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "GANTRY_WEBHOOK_ALLOW_HTTP": "true",
            "GANTRY_WEBHOOK_BACKOFF_BASE_S": "0.2",
        },
    )
    yield worker.log
    worker.stop(grace=15)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_worker_delivers_the_signed_webhook_after_a_failure(control_worker):
    reset_job_state()
    org = funded_org()
    with HookServer(statuses=[503, 200]) as server:
        with override_settings(**LOCAL_HOOKS):
            job = JobFactory(org=org, status=JobStatus.RUNNING, webhook_url=server.url)
            # The terminal transition commits and queues the delivery on commit.
            job = end_job(job.id, to=JobStatus.SUCCEEDED, reason="done", actor="test")

        requests = server.wait_for(2, timeout=30)
        assert len(requests) == 2, control_worker()[-3000:]
        deadline = time.monotonic() + 15
        while not JobEvent.objects.filter(job=job, data__webhook="delivered").exists():
            assert time.monotonic() < deadline, control_worker()[-3000:]
            time.sleep(0.1)

    body = assert_signed_job_body(requests[1], org, job)
    assert body["finished_at"] and body["status"] == "succeeded"
    assert json.loads(requests[0]["body"])["id"] == body["id"]
    note = JobEvent.objects.get(job=job, data__webhook="delivered")
    assert note.data["tries"] == 2 and note.actor == "webhooks"


def test_a_webhook_whose_publish_was_lost_is_queued_again_once(org):
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.models import Job
    from apps.jobs.services.admission import redis_client

    lost = finished_job(org, "https://hooks.test/lost")
    done = finished_job(org, "https://hooks.test/done")
    JobEvent.objects.create(
        job=done,
        from_status="succeeded",
        to_status="succeeded",
        reason="ok",
        actor="webhooks",
        data={"webhook": "delivered"},
    )
    fresh = finished_job(org, "https://hooks.test/fresh")  # may still be retrying: left alone
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk__in=[lost.pk, done.pk]).update(finished_at=two_hours_ago)

    assert webhooks.redeliver_stranded() == 1
    assert webhooks.redeliver_stranded() == 0  # its redelivery is already under way
    swept = {
        job.id: redis_client().exists(f"gantry:webhook:swept:{job.id}")
        for job in (lost, done, fresh)
    }
    assert swept == {lost.id: 1, done.id: 0, fresh.id: 0}
