"""A small HTTP client of the Gantry REST API (standard library only).

Every failure surfaces as one of three exceptions, so a caller can always say what
went wrong: ApiError (the API answered with an error), TransportError (the server could
not be reached) and ProtocolError (something answered that is not the Gantry API).
"""

from __future__ import annotations

import email.utils
import json
import mimetypes
import os
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode, urljoin, urlsplit

from gantry_client import __version__

USER_AGENT = f"gantry-client/{__version__}"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
CHUNK = 64 * 1024


class ApiError(Exception):
    """The API answered with an error status and (usually) the problem body."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        retry_after: float | None = None,
        body: dict | None = None,
        method: str = "",
        url: str = "",
        request_id: str = "",
    ):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.body = body
        self.method = method
        self.url = url
        self.request_id = request_id

    @property
    def details(self) -> dict:
        """Anything the error object carries beyond code, message and field."""
        error = (self.body or {}).get("error")
        if not isinstance(error, dict):
            return {}
        return {k: v for k, v in error.items() if k not in ("code", "message", "field")}


class TransportError(Exception):
    """The request never got an HTTP answer: refused, unresolvable, timed out, TLS."""

    def __init__(self, *, url: str, kind: str, reason: str):
        super().__init__(f"{kind}: {reason} ({url})")
        self.url = url
        self.kind = kind  # refused | dns | timeout | tls | network
        self.reason = reason


class ProtocolError(Exception):
    """An HTTP answer that the Gantry API would not give (not JSON, odd redirect)."""

    def __init__(self, *, url: str, status: int, problem: str, content_type: str = ""):
        super().__init__(problem)
        self.url = url
        self.status = status
        self.problem = problem
        self.content_type = content_type


@dataclass
class Response:
    status: int
    data: object
    headers: Message = field(repr=False)
    url: str = ""

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed", "").lower() == "true"


@dataclass(frozen=True)
class Download:
    path: Path
    size: int
    content_type: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # Redirects are handled by hand: the API key must never follow one to another host.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait, from either form of Retry-After (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _transport_error(url: str, exc: BaseException) -> TransportError:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return TransportError(url=url, kind="refused", reason="connection refused")
    if isinstance(reason, socket.gaierror):
        return TransportError(url=url, kind="dns", reason=f"cannot resolve host ({reason})")
    if isinstance(reason, TimeoutError | socket.timeout):
        return TransportError(url=url, kind="timeout", reason="no answer in time")
    if isinstance(reason, ssl.SSLError):
        return TransportError(url=url, kind="tls", reason=f"TLS failed ({reason})")
    if isinstance(reason, ConnectionResetError):
        return TransportError(url=url, kind="network", reason="connection reset by the server")
    return TransportError(url=url, kind="network", reason=str(reason) or type(reason).__name__)


class GantryAPI:
    """One API endpoint and key. Methods return the decoded JSON of the answer."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    # -- plumbing ------------------------------------------------------------------------

    def url(self, path: str, query: dict | None = None) -> str:
        url = f"{self.base_url}{path}"
        pairs = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
        return f"{url}?{urlencode(pairs, doseq=True)}" if pairs else url

    def _headers(self, *, url: str, extra: dict | None = None) -> dict:
        headers = {
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            # Echoed by the server and written on its log lines: quoted in 5xx messages.
            "X-Request-Id": uuid.uuid4().hex,
        }
        if self.api_key and self._same_origin(url):
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(extra or {})
        return headers

    def _same_origin(self, url: str) -> bool:
        mine, theirs = urlsplit(self.base_url), urlsplit(url)
        return (mine.scheme, mine.netloc) == (theirs.scheme, theirs.netloc)

    def _open(self, method: str, url: str, *, body: object = None, headers: dict | None = None):
        """The raw answer (also for error statuses) or a TransportError."""
        data = None
        all_headers = self._headers(url=url, extra=headers)
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        if urlsplit(url).scheme not in ("http", "https"):
            # A redirect must not turn a download into a read of file: or ftp: URLs.
            raise ProtocolError(url=url, status=0, problem="not an http(s) URL")
        request = urllib.request.Request(  # noqa: S310 (scheme checked just above)
            url, data=data, method=method, headers=all_headers
        )
        try:
            return self._opener.open(request, timeout=self.timeout), all_headers["X-Request-Id"]
        except urllib.error.HTTPError as answer:  # an HTTP answer all the same
            return answer, all_headers["X-Request-Id"]
        except (urllib.error.URLError, OSError) as exc:
            raise _transport_error(url, exc) from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict | None = None,
        body: object = None,
        headers: dict | None = None,
    ) -> Response:
        url = self.url(path, query)
        answer, request_id = self._open(method, url, body=body, headers=headers)
        with answer:
            try:
                raw = answer.read()
            except (OSError, TimeoutError) as exc:
                raise _transport_error(url, exc) from exc
            status = answer.status if hasattr(answer, "status") else answer.code
            content_type = answer.headers.get("Content-Type", "")
            request_id = answer.headers.get("X-Request-Id") or request_id
            data = _decode_json(raw)
            if status >= 400:
                raise _api_error(status, data, raw, answer.headers, method, url, request_id)
            if 300 <= status < 400:
                location = answer.headers.get("Location", "")
                raise ProtocolError(
                    url=url,
                    status=status,
                    problem=f"the server redirected to {location or 'nowhere'} "
                    "(is the API URL right, e.g. https instead of http?)",
                )
            if data is _NOT_JSON:
                raise ProtocolError(
                    url=url,
                    status=status,
                    content_type=content_type,
                    problem=f"the answer is not JSON: {_snippet(raw)}",
                )
            return Response(status=status, data=data, headers=answer.headers, url=url)

    # -- jobs ----------------------------------------------------------------------------

    def submit_job(self, spec: dict, *, idempotency_key: str) -> Response:
        """POST /v1/jobs; the Response tells whether the server replayed an earlier answer."""
        return self.request(
            "POST", "/v1/jobs", body=spec, headers={"Idempotency-Key": idempotency_key}
        )

    def get_job(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{_segment(job_id)}").data

    def list_jobs(
        self,
        *,
        status: str | None = None,
        project: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict:
        query = {"status": status, "project": project, "limit": limit, "cursor": cursor}
        return self.request("GET", "/v1/jobs", query=query).data

    def cancel_job(self, job_id: str) -> dict:
        return self.request("POST", f"/v1/jobs/{_segment(job_id)}/cancel").data

    def job_events(self, job_id: str) -> list[dict]:
        """All events, oldest first (following cursors if the server pages them)."""
        events, cursor = [], None
        while True:
            page = self.request(
                "GET", f"/v1/jobs/{_segment(job_id)}/events", query={"cursor": cursor}
            ).data
            events.extend(page.get("results", []))
            cursor = next_cursor(page)
            if not cursor:
                return events

    def balance(self) -> dict:
        return self.request("GET", "/v1/balance").data

    # -- following a job -----------------------------------------------------------------

    def follow(
        self,
        job_id: str,
        *,
        poll_min: float = 0.5,
        poll_max: float = 10.0,
        max_transient_failures: int = 10,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[dict]:
        """Poll the job until it is terminal, yielding each snapshot.

        Polling backs off geometrically while nothing changes and comes back to poll_min
        when status or progress moves. Once the job has been read, short outages (refused,
        timeouts, 5xx, 429) are waited out up to max_transient_failures in a row; errors
        that would not go away by waiting (401, 404...) are raised at once, and so is any
        error of the first read (a wrong URL or key should not keep anyone waiting).
        """
        poll_min = min(poll_min, poll_max)
        interval, failures, last = poll_min, 0, None
        while True:
            try:
                job = self.get_job(job_id)
            except (TransportError, ApiError) as exc:
                transient = (
                    isinstance(exc, TransportError) or exc.status == 429 or exc.status >= 500
                )
                failures += 1
                if last is None or not transient or failures > max_transient_failures:
                    raise
                wait = getattr(exc, "retry_after", None) or interval
                sleep(min(max(wait, poll_min), max(poll_max, 60.0)))
                interval = min(interval * 2, poll_max)
                continue
            failures = 0
            yield job
            if job.get("status") in TERMINAL_STATUSES:
                return
            seen = (job.get("status"), job.get("progress"))
            interval = poll_min if seen != last else min(interval * 1.5, poll_max)
            last = seen
            sleep(interval)

    # -- results -------------------------------------------------------------------------

    def download_result(self, job_id: str, destination: Path | None) -> Download:
        """Fetch the job's output: GET /v1/jobs/{id}/result, then its signed URL.

        destination: a file path, an existing directory (the file is named
        <job id><ext>), or None for the current directory. The file appears whole or
        not at all (written beside it, then renamed).
        """
        url = self.url(f"/v1/jobs/{_segment(job_id)}/result")
        for _hop in range(5):
            answer, request_id = self._open("GET", url, headers={"Accept": "*/*"})
            status = answer.status if hasattr(answer, "status") else answer.code
            if 300 <= status < 400:
                location = answer.headers.get("Location")
                answer.close()
                if not location:
                    raise ProtocolError(
                        url=url, status=status, problem="a redirect without Location"
                    )
                url = urljoin(url, location)
                continue
            with answer:
                if status >= 400:
                    raw = answer.read()
                    raise _api_error(
                        status, _decode_json(raw), raw, answer.headers, "GET", url, request_id
                    )
                return _save(answer, url=url, job_id=job_id, destination=destination)
        raise ProtocolError(url=url, status=302, problem="too many redirects")


# -- helpers ------------------------------------------------------------------------------

_NOT_JSON = object()


def _decode_json(raw: bytes):
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return _NOT_JSON


def _snippet(raw: bytes, limit: int = 120) -> str:
    text = raw.decode("utf-8", "replace").strip().replace("\n", " ")
    return repr(text[:limit] + ("…" if len(text) > limit else ""))


def _segment(value: str) -> str:
    return quote(str(value), safe="")


def _api_error(status, data, raw, headers, method, url, request_id) -> ApiError:
    retry_after = parse_retry_after(headers.get("Retry-After"))
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return ApiError(
            status=status,
            code=str(error.get("code") or f"http_{status}"),
            message=str(error.get("message") or ""),
            field=error.get("field"),
            retry_after=retry_after,
            body=data,
            method=method,
            url=url,
            request_id=request_id,
        )
    # Not the problem shape (a proxy's page, a crash before the API): say what came back.
    message = _snippet(raw) if raw.strip() else "(empty body)"
    return ApiError(
        status=status,
        code=f"http_{status}",
        message=f"unexpected answer {message}",
        retry_after=retry_after,
        body=data if isinstance(data, dict) else None,
        method=method,
        url=url,
        request_id=request_id,
    )


def next_cursor(page: dict) -> str | None:
    """The cursor of the next page, whether `next` is a bare cursor or a URL holding one."""
    nxt = page.get("next") if isinstance(page, dict) else None
    if not nxt:
        return None
    if "://" in nxt or nxt.startswith("/"):
        # Re-asked against our own base URL: the server may not know its public address.
        values = parse_qs(urlsplit(nxt).query).get("cursor")
        return values[0] if values else None
    return nxt


def _file_name(url: str, headers: Message, job_id: str) -> str:
    """<job id> plus the output's extension: from Content-Disposition, URL, content type."""
    candidates = []
    disposition = headers.get_param("filename", header="Content-Disposition")
    if isinstance(disposition, str):
        candidates.append(disposition)
    candidates.append(urlsplit(url).path.rsplit("/", 1)[-1])
    for name in candidates:
        ext = os.path.splitext(name)[1]
        if 1 < len(ext) <= 10 and ext[1:].isalnum():
            return f"{job_id}{ext.lower()}"
    ctype = headers.get_content_type()
    ext = mimetypes.guess_extension(ctype) if ctype != "application/octet-stream" else None
    return f"{job_id}{ext or '.bin'}"


def _save(answer, *, url: str, job_id: str, destination: Path | None) -> Download:
    name = _file_name(url, answer.headers, job_id)
    if destination is None:
        target = Path.cwd() / name
    elif destination.is_dir() or str(destination).endswith(os.sep):
        target = destination / name
    else:
        target = destination
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := answer.read(CHUNK):
                out.write(chunk)
                size += len(chunk)
        expected = answer.headers.get("Content-Length")
        if expected and expected.isdigit() and int(expected) != size:
            raise TransportError(
                url=url, kind="network", reason=f"download cut short ({size} of {expected} bytes)"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except (TimeoutError, ConnectionError) as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _transport_error(url, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Download(path=target, size=size, content_type=answer.headers.get_content_type())
