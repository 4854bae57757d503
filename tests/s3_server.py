"""An S3-compatible server the tests start themselves: moto's server mode.

`moto.server` speaks the S3 protocol over HTTP on a free 127.0.0.1 port, in its own
process group (tests/worker_harness.Process: killed at teardown, and if pytest dies).
Its credentials are fake: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_DEFAULT_REGION are
set for the test process and passed to every worker (see S3Server.env). Production uses
S3, MinIO or another S3-compatible store the same way (GANTRY_S3_ENDPOINT_URL).
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.worker_harness import Process, free_port

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def s3_missing() -> str:
    """Why the S3 tests cannot run here ("" when they can)."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        return f"needs boto3 and moto[server] (pip install -e '.[dev]'): {exc}"
    return ""


@dataclass
class S3Server:
    """A running moto S3 server and the bucket made for the tests."""

    process: Process
    endpoint_url: str
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        """The environment a worker or API process needs to use this store."""
        return {
            **FAKE_CREDENTIALS,
            "GANTRY_RESULT_STORAGE": "s3",
            "GANTRY_S3_BUCKET": self.bucket,
            "GANTRY_S3_ENDPOINT_URL": self.endpoint_url,
            "GANTRY_S3_REGION": FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        }

    def settings(self, settings_fixture) -> None:
        """Point this process (pytest-django's `settings`) at the store."""
        settings_fixture.GANTRY_RESULT_STORAGE = "s3"
        settings_fixture.GANTRY_S3_BUCKET = self.bucket
        settings_fixture.GANTRY_S3_ENDPOINT_URL = self.endpoint_url
        settings_fixture.GANTRY_S3_REGION = FAKE_CREDENTIALS["AWS_DEFAULT_REGION"]

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def object_keys(self, prefix: str = "") -> list[str]:
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    @classmethod
    def start(cls, tmp: Path) -> S3Server:
        port = free_port()
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        env = {**os.environ, **FAKE_CREDENTIALS}
        process = Process("moto s3", argv, env, tmp / "moto.log").start()
        try:
            process.wait_http_ok(port, "/moto-api/", timeout=30)
        except RuntimeError:
            process.stop(grace=0)
            raise
        server = cls(process, f"http://127.0.0.1:{port}", f"gantry-test-{uuid.uuid4().hex[:8]}")
        server.client().create_bucket(Bucket=server.bucket)
        return server


def s3_fixture(scope: str = "module"):
    """A pytest fixture yielding a started S3Server (fake credentials in os.environ while
    it runs); skips, naming what is missing, where boto3 or moto is not installed."""

    @pytest.fixture(scope=scope)
    def s3(tmp_path_factory):
        missing = s3_missing()
        if missing:
            pytest.skip(missing)
        saved = {name: os.environ.get(name) for name in FAKE_CREDENTIALS}
        os.environ.update(FAKE_CREDENTIALS)
        server = S3Server.start(tmp_path_factory.mktemp("s3"))
        try:
            yield server
        finally:
            server.process.stop(grace=0)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    return s3
