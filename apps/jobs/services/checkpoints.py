"""Checkpoints in object storage, so a job resumes on any host with no shared filesystem.

The generator always reads and writes its checkpoint in a local folder (`local_dir`).
What that folder is depends on GANTRY_CHECKPOINT_STORAGE (default "": the same as
GANTRY_RESULT_STORAGE):

- "filesystem": GANTRY_CHECKPOINT_ROOT/<job id>, on a filesystem every node shares
  (MEDIA_ROOT). The folder itself is the checkpoint; `pull` and `push` copy nothing.
- "s3": a working copy in the attempt's node-local scratch folder (removed with it after
  the run), while the store holds the checkpoint as objects
  `<GANTRY_S3_CHECKPOINT_PREFIX = "checkpoints/"><job id>/<relative path>` in
  GANTRY_S3_BUCKET. The runner

  * `pull`s before it starts an attempt: the store's copy is downloaded into the empty
    working copy, so `--resume` finds the last checkpoint pushed from whichever host;
  * `push`es whenever the generator reports a checkpoint (in the background, after the
    heartbeat that reported it was accepted: a fenced runner pushes nothing more) and
    once more after the generator exited, before the attempt's end is recorded: the
    attempt that follows (a retry, a resumed preemption) always pulls at least that.

Guarantees: every file is one PUT, replaced atomically (a reader sees the old or the new
file, never half of one); files the generator writes as hidden temporaries (".name")
are never pushed; objects the folder no longer has are deleted after the new files are
up. A host lost between two pushes loses only the work since the last push, as a
generator killed before its next checkpoint would on a shared filesystem. Not
guaranteed: a checkpoint of several files that depend on one another is pushed file by
file, so a host lost mid-push can leave a mix of two checkpoints (the stand-in, like
most generators, writes one file).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path, PurePosixPath

from django.conf import settings

from apps.jobs.services.results import S3Storage

logger = logging.getLogger(__name__)

_store: S3Storage | None = None
_store_config: tuple | None = None


def storage_kind() -> str:
    """ "filesystem" or "s3": GANTRY_CHECKPOINT_STORAGE, else GANTRY_RESULT_STORAGE."""
    kind = settings.GANTRY_CHECKPOINT_STORAGE or settings.GANTRY_RESULT_STORAGE
    if kind not in ("filesystem", "s3"):
        raise RuntimeError(f"unknown GANTRY_CHECKPOINT_STORAGE {kind!r}")
    return kind


def remote_store() -> S3Storage | None:
    """The object store holding checkpoints, or None when the filesystem does."""
    global _store, _store_config
    if storage_kind() != "s3":
        return None
    config = (
        settings.GANTRY_S3_BUCKET,
        settings.GANTRY_S3_CHECKPOINT_PREFIX,
        settings.GANTRY_S3_ENDPOINT_URL,
        settings.GANTRY_S3_REGION,
    )
    if _store is None or config != _store_config:
        _store = S3Storage(
            bucket=settings.GANTRY_S3_BUCKET,
            prefix=settings.GANTRY_S3_CHECKPOINT_PREFIX,
            endpoint_url=settings.GANTRY_S3_ENDPOINT_URL,
            region=settings.GANTRY_S3_REGION,
        )
        _store_config = config
    return _store


def local_dir(job_id, scratch: Path) -> Path:
    """The folder the generator gets as --checkpoint-dir for an attempt whose scratch
    folder is `scratch`: the shared GANTRY_CHECKPOINT_ROOT/<job id> on the filesystem
    backend, a working copy in the scratch folder with the store."""
    if remote_store() is None:
        return Path(settings.GANTRY_CHECKPOINT_ROOT) / str(job_id)
    return scratch / "checkpoint"


def _local_files(directory: Path) -> dict[str, Path]:
    """The folder's files by relative POSIX path, hidden files and folders left out."""
    if not directory.is_dir():
        return {}
    files = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and not any(part.startswith(".") for part in relative.parts):
            files[relative.as_posix()] = path
    return files


def push(job_id, directory: Path) -> int:
    """Copy the job's checkpoint folder to the store; returns the files uploaded (0 and
    no copy when checkpoints are on the filesystem). Raises on a store error."""
    store = remote_store()
    if store is None:
        return 0
    folder = str(job_id)
    local = _local_files(directory)
    for relative, path in local.items():
        store.save(f"{folder}/{relative}", path)
    stale = set(store.keys(folder)) - {f"{folder}/{r}" for r in local}
    for key in sorted(stale):
        store.delete(key)
    return len(local)


def pull(job_id, directory: Path) -> int:
    """Replace the job's local checkpoint folder by the store's copy; returns the files
    downloaded. Leaves the folder as it is when the store has none (and always when
    checkpoints are on the filesystem). Raises on a store error."""
    store = remote_store()
    if store is None:
        return 0
    folder = str(job_id)
    keys = store.keys(folder)
    if not keys:
        return 0
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    for key in keys:
        relative = PurePosixPath(key).relative_to(folder)
        target = directory.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        store.download(key, target)
    return len(keys)


__all__ = ["local_dir", "pull", "push", "remote_store", "storage_kind"]
