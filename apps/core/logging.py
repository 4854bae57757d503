"""JSON-lines logging that says which request, job, attempt, org and task a line is about.

The context travels in contextvars (one per thread, so each Celery thread-pool slot and
each gunicorn request has its own):

- the request id: set by RequestIdMiddleware from X-Request-Id (or minted); config.celery
  copies it into the headers of every task published meanwhile and back into the context
  while a worker runs that task;
- the job: `job_log_context(job=..., attempt=...)` around work on one job (the runner, the
  dispatcher) adds job_id, attempt_id and org_id, and may set the request id to the one
  of the request that submitted the job;
- the Celery task (name and id), set by config.celery while a task runs.

ContextFilter copies them onto every record; JsonFormatter writes one JSON object a line,
with any `extra=` fields of the call as well.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from types import MappingProxyType

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)
_EMPTY = MappingProxyType({})
_context_var: contextvars.ContextVar[MappingProxyType] = contextvars.ContextVar(
    "gantry_log_context", default=_EMPTY
)
CONTEXT_FIELDS = ("request_id", "job_id", "attempt_id", "org_id", "task", "task_id")
# What a LogRecord carries by itself; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    *CONTEXT_FIELDS,
}
_KEEP = object()


def current_request_id() -> str | None:
    """The request id of the request (or task) this code runs for, if any."""
    return request_id_var.get()


def log_context() -> dict[str, str]:
    """The current context fields (request id included), as put on log lines."""
    fields = dict(_context_var.get())
    request_id = request_id_var.get()
    if request_id:
        fields["request_id"] = request_id
    return fields


@contextlib.contextmanager
def job_log_context(
    *,
    job=None,
    attempt=None,
    job_id=None,
    attempt_id=None,
    org_id=None,
    request_id=_KEEP,
) -> Iterator[None]:
    """Put job_id / attempt_id / org_id (from `job` and `attempt`, or given) on every log
    line inside the block, and restore the outer context after it.

    `request_id` replaces the current request id inside the block (None removes it): a
    job's lines should carry the request that submitted the job, not whichever request
    or task happened to wake the code that handles it.
    """
    if job is not None:
        job_id = job_id or job.pk
        org_id = org_id or job.org_id
    if attempt is not None:
        attempt_id = attempt_id or attempt.pk
        job_id = job_id or attempt.job_id
    fields = dict(_context_var.get())
    for name, value in (("job_id", job_id), ("attempt_id", attempt_id), ("org_id", org_id)):
        if value is not None:
            fields[name] = str(value)
    token = _context_var.set(MappingProxyType(fields))
    request_token = None if request_id is _KEEP else request_id_var.set(request_id or None)
    try:
        yield
    finally:
        if request_token is not None:
            request_id_var.reset(request_token)
        _context_var.reset(token)


def bind_task(*, name: str, task_id: str, request_id: str | None) -> None:
    """Start the context of a Celery task run (task_prerun): its name, id and request id.

    Replaces, rather than nests in, whatever the thread had: a pool thread runs one task
    after another, and none may inherit the previous one's context.
    """
    _context_var.set(MappingProxyType({"task": name, "task_id": task_id}))
    request_id_var.set(request_id or None)


def unbind_task() -> None:
    """End the context of a Celery task run (task_postrun)."""
    _context_var.set(_EMPTY)
    request_id_var.set(None)


class ContextFilter(logging.Filter):
    """Put the current context fields on each record (an explicit `extra=` value wins)."""

    def filter(self, record):
        context = _context_var.get()
        for name in CONTEXT_FIELDS:
            if getattr(record, name, None) is None:
                value = request_id_var.get() if name == "request_id" else context.get(name)
                setattr(record, name, value)
        return True


# The name settings.LOGGING uses.
RequestIdFilter = ContextFilter


# The host a line comes from: logs of many hosts are read together (a collector, or an
# operator grepping several machines' files), and pids repeat across hosts.
HOST = socket.gethostname()


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, msg, host, pid, the context fields,
    extras."""

    def format(self, record):
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "host": HOST,
            "pid": record.process or os.getpid(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = str(value)
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in line:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """One readable line per event, for a terminal (`make up`): time, the process's name
    (GANTRY_PROCESS_NAME, set per program by the launcher), level, logger, message and
    the context fields; JsonFormatter is the machine-readable default."""

    def format(self, record):
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        process = os.environ.get("GANTRY_PROCESS_NAME") or str(record.process or os.getpid())
        context = " ".join(
            f"{field}={getattr(record, field)}"
            for field in CONTEXT_FIELDS
            if getattr(record, field, None) is not None
        )
        line = f"{when} {process:<16} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if context:
            line = f"{line}  [{context}]"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line
