"""Job outputs: a small storage interface and signed, expiring download links.

Backends (settings.GANTRY_RESULT_STORAGE):

- "filesystem" (default): files under MEDIA_ROOT/results/<org>/<job>/<name>.
- "s3": S3, MinIO or any S3-compatible store via boto3 (the `s3` extra, imported only
  when selected) in GANTRY_S3_BUCKET under GANTRY_S3_PREFIX, at GANTRY_S3_ENDPOINT_URL
  when set (path-style addressing there). The signed link then redirects to a
  short-lived URL presigned by the store. The test suite runs it against moto's S3
  server (tests/s3_server.py): round trips, presigned downloads, keys confined to the
  prefix, a missing object answered 404/410 and never 500. Checkpoints use the same
  backend classes (services/checkpoints.py).

A link is `<PUBLIC_URL>/v1/results/<token>`: the token is the job id, the storage key
and an expiry instant, signed with Django's signing (HMAC with SECRET_KEY and a salt of
its own). A changed token is refused (403), an expired one is gone (410); a token stays
bound to the result it was issued for.
"""

from __future__ import annotations

import mimetypes
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from django.conf import settings
from django.core import signing

from apps.core.errors import GantryError
from apps.jobs.models import Job

RESULT_LINK_SALT = "gantry.jobs.result-link"


class ResultLinkInvalid(GantryError):
    status_code = 403
    code = "invalid_link"


class ResultLinkExpired(GantryError):
    status_code = 410
    code = "link_expired"


class NoResult(GantryError):
    status_code = 404
    code = "no_result"


class ResultStorage(Protocol):
    def save(self, key: str, source: Path) -> None: ...

    def open(self, key: str) -> BinaryIO: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def direct_url(self, key: str, *, expires_in: int, filename: str) -> str | None:
        """A URL the client may fetch directly (S3 presigned), or None to stream it."""
        ...


def _safe_key(key: str) -> PurePosixPath:
    path = PurePosixPath(key)
    if path.is_absolute() or not path.parts or any(p in ("..", ".", "") for p in path.parts):
        raise ValueError(f"unsafe storage key {key!r}")
    return path


class FileSystemStorage:
    """Results as files under a root folder (MEDIA_ROOT/results by default)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_safe_key(key).parts)

    def save(self, key: str, source: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(source, partial)
        partial.replace(target)  # readers never see half a file

    def open(self, key: str) -> BinaryIO:
        return self._path(key).open("rb")

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def direct_url(self, key: str, *, expires_in: int, filename: str) -> str | None:
        return None


class S3Storage:
    """Objects in an S3-compatible bucket (boto3; credentials from its usual chain).

    Keys are `_safe_key`-checked and put under `prefix`, so no key reaches outside it.
    An upload is one PUT (multipart for big files, completed atomically): a reader sees
    the old object or the new one, never half of one. A missing object is
    FileNotFoundError from open(), like the filesystem backend.
    """

    def __init__(self, *, bucket: str, prefix: str = "", endpoint_url: str = "", region: str = ""):
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # optional dependency: the `s3` extra
            raise RuntimeError(
                "GANTRY_RESULT_STORAGE=s3 needs boto3 installed (pip install 'gantry[s3]')"
            ) from exc
        if not bucket:
            raise RuntimeError("GANTRY_RESULT_STORAGE=s3 needs GANTRY_S3_BUCKET")
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else f"{prefix}/"
        config = Config(
            signature_version="s3v4",
            # MinIO, moto and most self-hosted stores serve buckets by path, not by name.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            retries={"max_attempts": 5, "mode": "standard"},
            # botocore waits 60 s by default: on a host cut off from the store, a
            # checkpoint upload would hang for minutes and might land long after the
            # runner's lease ran out. Seconds bound it (a large part still streams).
            connect_timeout=5,
            read_timeout=30,
        )
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config
        )

    def _object(self, key: str) -> str:
        return f"{self.prefix}{_safe_key(key)}"

    @staticmethod
    def _is_missing(exc: Exception) -> bool:
        error = getattr(exc, "response", {}).get("Error", {})
        return error.get("Code") in ("404", "NoSuchKey", "NotFound")

    def save(self, key: str, source: Path) -> None:
        self.client.upload_file(str(source), self.bucket, self._object(key))

    def open(self, key: str) -> BinaryIO:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._object(key))["Body"]
        except ClientError as exc:
            if self._is_missing(exc):
                raise FileNotFoundError(key) from exc
            raise

    def download(self, key: str, target: Path) -> None:
        """Copy the object to `target` (written beside it first, then renamed)."""
        partial = target.with_name(f".{target.name}.partial")
        try:
            with self.open(key) as body, partial.open("wb") as fh:
                shutil.copyfileobj(body, fh)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if self._is_missing(exc):
                return False
            raise
        return True

    def keys(self, under: str) -> list[str]:
        """The keys (relative to the prefix) of every object under the folder `under`."""
        folder = f"{self._object(under)}/"
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=folder
        )
        return sorted(
            obj["Key"][len(self.prefix) :] for page in pages for obj in page.get("Contents", [])
        )

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._object(key))

    def direct_url(self, key: str, *, expires_in: int, filename: str) -> str | None:
        return self.client.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": self._object(key),
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
            },
            ExpiresIn=max(1, expires_in),
        )


_storage: ResultStorage | None = None
_storage_config: tuple | None = None


def storage() -> ResultStorage:
    """The configured backend (rebuilt when the settings it depends on change)."""
    global _storage, _storage_config
    config = (
        settings.GANTRY_RESULT_STORAGE,
        str(settings.MEDIA_ROOT),
        settings.GANTRY_S3_BUCKET,
        settings.GANTRY_S3_PREFIX,
        settings.GANTRY_S3_ENDPOINT_URL,
        settings.GANTRY_S3_REGION,
    )
    if _storage is None or config != _storage_config:
        kind = settings.GANTRY_RESULT_STORAGE
        if kind == "filesystem":
            _storage = FileSystemStorage(Path(settings.MEDIA_ROOT) / "results")
        elif kind == "s3":
            _storage = S3Storage(
                bucket=settings.GANTRY_S3_BUCKET,
                prefix=settings.GANTRY_S3_PREFIX,
                endpoint_url=settings.GANTRY_S3_ENDPOINT_URL,
                region=settings.GANTRY_S3_REGION,
            )
        else:
            raise RuntimeError(f"unknown GANTRY_RESULT_STORAGE {kind!r}")
        _storage_config = config
    return _storage


def result_key(job: Job, filename: str) -> str:
    name = Path(filename).name or "output"
    return f"{job.org_id}/{job.id}/{name}"


def store_result(job: Job, path_to_file: str | Path) -> str:
    """Copy a finished job's output file into storage; returns its storage key.

    For the runner: put the key in `job.result_path` with the terminal transition
    (`transition(..., changes={"result_path": key})`). Storing again overwrites the
    same key, so a retried finish is harmless.
    """
    source = Path(path_to_file)
    if not source.is_file():
        raise FileNotFoundError(source)
    key = result_key(job, source.name)
    storage().save(key, source)
    return key


@dataclass(frozen=True)
class SignedLink:
    url: str
    path: str
    expires_at: datetime


def signed_result_link(job: Job, *, ttl_s: int | None = None) -> SignedLink:
    """A download link to the job's result, valid for `ttl_s` seconds (default setting)."""
    if not job.result_path:
        raise NoResult("This job has no result (yet).")
    ttl = settings.GANTRY_RESULT_URL_TTL_S if ttl_s is None else ttl_s
    expires = int(time.time()) + ttl
    token = signing.dumps(
        {"j": str(job.id), "k": job.result_path, "e": expires},
        salt=RESULT_LINK_SALT,
        compress=False,
    )
    path = f"/v1/results/{token}"
    return SignedLink(
        url=f"{settings.PUBLIC_URL.rstrip('/')}{path}",
        path=path,
        expires_at=datetime.fromtimestamp(expires, tz=UTC),
    )


@dataclass(frozen=True)
class ResultDownload:
    job_id: str
    key: str
    filename: str
    expires_in: int


def open_result_link(token: str) -> ResultDownload:
    """Check a link token: 403 if it was altered, 410 if expired or the result is gone."""
    try:
        payload = signing.loads(token, salt=RESULT_LINK_SALT)
        job_id, key, expires = payload["j"], payload["k"], int(payload["e"])
    except (signing.BadSignature, KeyError, TypeError, ValueError) as exc:
        raise ResultLinkInvalid("This result link is not valid.") from exc
    remaining = expires - int(time.time())
    if remaining <= 0:
        raise ResultLinkExpired("This result link has expired; ask the API for a new one.")
    if not Job.objects.filter(pk=job_id, result_path=key).exists():
        raise ResultLinkExpired("This result is no longer available.")
    return ResultDownload(
        job_id=job_id, key=key, filename=PurePosixPath(key).name, expires_in=remaining
    )


def content_type_of(filename: str) -> str:
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"
