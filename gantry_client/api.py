"""A small HTTP client of the Gantry REST API (standard library only).

Every failure surfaces as one of three exceptions, so a caller can always say what
went wrong: ApiError (the API answered with an error), TransportError (the server could
not be reached) and ProtocolError (something answered that is not the Gantry API).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import mimetypes
import os
import re
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urljoin, urlsplit

from gantry_client import __version__

USER_AGENT = f"gantry-client/{__version__}"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
CHUNK = 64 * 1024
# The server sends a keep-alive comment every 15 s on an idle stream: a stream silent for
# this long is dead, whatever --timeout says (a short --timeout must not cut idle streams).
STREAM_IDLE_TIMEOUT_S = 45.0
RETRY_AFTER_CAP_S = 60.0  # the longest a server's Retry-After holds a follower back
# The server's log stream says so when its live buffer no longer holds a line asked for.
_SKIPPED_LINES = re.compile(r"^\[\.\.\. (\d+) lines skipped \.\.\.\]$")


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


class StreamNotOffered(ProtocolError):
    """The server answered a stream request with something that is not an event stream
    (an older server, a proxy that buffers): the caller should poll instead."""


@dataclass(frozen=True)
class ServerEvent:
    """One Server-Sent Event: its type (`message` when unnamed), its data, its id."""

    event: str
    data: str
    id: str | None = None


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
        self.clock_offset_s = 0.0  # the server's clock minus ours, from its Date headers

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

    def _open(
        self,
        method: str,
        url: str,
        *,
        body: object = None,
        headers: dict | None = None,
        timeout: float | None = None,
    ):
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
            answer = self._opener.open(request, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as answer:  # an HTTP answer all the same
            self._note_server_clock(answer.headers)
            return answer, all_headers["X-Request-Id"]
        except (urllib.error.URLError, OSError) as exc:
            raise _transport_error(url, exc) from exc
        self._note_server_clock(answer.headers)
        return answer, all_headers["X-Request-Id"]

    def _note_server_clock(self, headers: Message) -> None:
        # Elapsed times and start estimates are reckoned on the server's clock, so that a
        # client whose clock is off does not show "started 5 min ago" for a new job.
        try:
            sent = email.utils.parsedate_to_datetime(headers.get("Date", ""))
        except (TypeError, ValueError):
            return
        if sent is None:
            return
        offset = sent.timestamp() - time.time()
        # Date is to the second: a smaller difference is its rounding, not a skewed clock.
        self.clock_offset_s = offset if abs(offset) >= 2.0 else 0.0

    def server_now(self) -> datetime:
        """Now by the server's clock (as of its last Date header, to the second)."""
        return datetime.fromtimestamp(time.time() + self.clock_offset_s, tz=UTC)

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

    def pages(self, path: str, query: dict | None = None) -> Iterator[dict]:
        """Every item of a cursor-paginated listing, page after page."""
        cursor = None
        while True:
            page = self.request("GET", path, query={**(query or {}), "cursor": cursor}).data
            yield from page.get("results", [])
            cursor = next_cursor(page)
            if not cursor:
                return

    def project_names(self) -> dict[str, str]:
        """Project id -> name for the key's org: GET /v1/orgs, then its projects.

        {} where that is not one org (an operator key sees them all: which one would it
        be?). Errors propagate; the caller decides whether names matter enough."""
        orgs = self.request("GET", "/v1/orgs").data.get("results") or []
        if len(orgs) != 1:
            return {}
        org = _segment(orgs[0]["id"])
        return {str(p["id"]): p["name"] for p in self.pages(f"/v1/orgs/{org}/projects")}

    def request_text(self, path: str, *, query: dict | None = None) -> str:
        """A GET whose answer is text (a log), not JSON; errors as request() raises them."""
        url = self.url(path, query)
        answer, request_id = self._open("GET", url, headers={"Accept": "text/plain"})
        with answer:
            try:
                raw = answer.read()
            except (OSError, http.client.HTTPException) as exc:
                raise _transport_error(url, exc) from exc
            status = answer.status if hasattr(answer, "status") else answer.code
            if status >= 400:
                request_id = answer.headers.get("X-Request-Id") or request_id
                raise _api_error(
                    status, _decode_json(raw), raw, answer.headers, "GET", url, request_id
                )
            if 300 <= status < 400:
                raise ProtocolError(url=url, status=status, problem="an unexpected redirect")
            charset = answer.headers.get_content_charset() or "utf-8"
            return raw.decode(charset, "replace")

    # -- event streams -------------------------------------------------------------------

    def events(self, path: str, *, query: dict | None = None) -> Iterator[ServerEvent | None]:
        """The Server-Sent Events of a stream endpoint, None for each comment (keep-alive).

        The request goes out on the first next(). Ends when the server closes the stream;
        raises ApiError for an error answer, StreamNotOffered for an answer that is not an
        event stream, TransportError when the connection fails or is cut."""
        url = self.url(path, query)
        timeout = max(self.timeout, STREAM_IDLE_TIMEOUT_S)
        answer, request_id = self._open(
            "GET",
            url,
            headers={"Accept": "text/event-stream", "Cache-Control": "no-cache"},
            timeout=timeout,
        )
        with answer:
            status = answer.status if hasattr(answer, "status") else answer.code
            try:
                if status >= 400:
                    raw = answer.read()
                    request_id = answer.headers.get("X-Request-Id") or request_id
                    raise _api_error(
                        status, _decode_json(raw), raw, answer.headers, "GET", url, request_id
                    )
                content_type = answer.headers.get_content_type()
                if status != 200 or content_type != "text/event-stream":
                    raise StreamNotOffered(
                        url=url,
                        status=status,
                        content_type=content_type,
                        problem=f"answered {status} {content_type}, not an event stream",
                    )
                yield from parse_sse(iter(answer.readline, b""))
            except (OSError, http.client.HTTPException) as exc:
                raise _transport_error(url, exc) from exc

    def job_stream(self, job_id: str) -> Iterator[dict]:
        """The job body from GET /v1/jobs/{id}/stream: at once, then on every change."""
        path = f"/v1/jobs/{_segment(job_id)}/stream"
        for event in self.events(path):
            if event is None or event.event != "job":
                continue
            try:
                body = json.loads(event.data)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise StreamNotOffered(
                    url=self.url(path), status=200, problem="a job event that is not a JSON object"
                )
            yield body

    def watch(
        self,
        job_id: str,
        *,
        poll_min: float = 0.5,
        poll_max: float = 10.0,
        max_transient_failures: int = 10,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[dict]:
        """The job's snapshots until it is terminal, from its event stream.

        A stream that drops (or cannot be opened: 5xx, 429, refused) is reconnected after
        one plain read of the job, pausing longer each time a reconnection brings no news
        (poll_min doubling up to poll_max); that read follows follow()'s rules, so a first
        read that fails raises at once and a long outage raises in the end. Where the
        server offers no stream (404, an older server, a buffering proxy), it polls.
        """
        last: dict | None = None
        quiet = failures = 0
        while True:
            news, asked_wait = False, 0.0
            try:
                for job in self.job_stream(job_id):
                    news = news or job != last
                    last = job
                    yield job
                    if job.get("status") in TERMINAL_STATUSES:
                        return
            except StreamNotOffered:
                yield from self.follow(job_id, poll_min=poll_min, poll_max=poll_max, sleep=sleep)
                return
            except ApiError as exc:
                if exc.status in (404, 405, 406, 501):
                    # No stream route here; polling says "no such job" if that is what it is.
                    yield from self.follow(
                        job_id, poll_min=poll_min, poll_max=poll_max, sleep=sleep
                    )
                    return
                if not _transient(exc):
                    raise
                asked_wait = min(exc.retry_after or 0.0, RETRY_AFTER_CAP_S)  # a 429's or 503's
            except TransportError:
                pass
            # The stream dropped or could not be opened: read the job, then reconnect.
            try:
                job = self.get_job(job_id)
            except (ApiError, TransportError) as exc:
                failures += 1
                if last is None or not _transient(exc) or failures > max_transient_failures:
                    raise
            else:
                failures = 0
                if job != last:
                    news, last = True, job
                    yield job
                if job.get("status") in TERMINAL_STATUSES:
                    return
            quiet = 0 if news else quiet + 1
            sleep(max(min(poll_min * 2**quiet, poll_max), asked_wait))

    # -- logs ----------------------------------------------------------------------------

    def job_log(self, job_id: str, attempt: int | None = None) -> str:
        """GET /v1/jobs/{id}/logs: what the generator printed in the attempt so far."""
        path = f"/v1/jobs/{_segment(job_id)}/logs"
        return self.request_text(path, query={"attempt": attempt})

    def job_log_stream(self, job_id: str, attempt: int | None = None) -> Iterator[str]:
        """The attempt's log lines as the server sends them, from the first, until it
        closes the stream (the attempt ended, or the connection dropped)."""
        path = f"/v1/jobs/{_segment(job_id)}/logs"
        for event in self.events(path, query={"attempt": attempt}):
            if event is not None and event.event == "line":
                yield event.data

    def follow_log(
        self,
        job_id: str,
        attempt: int,
        *,
        poll_min: float = 0.5,
        poll_max: float = 10.0,
        max_transient_failures: int = 10,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[str]:
        """Each line of the attempt's log once, as it is written, until the attempt ends.

        The server replays the log from its first line on every connection and closes
        the stream when the attempt ends; a close while the attempt still runs is a drop:
        reconnect, skipping the lines already given. Without a stream, poll the text.
        """
        given = failures = quiet = 0
        while True:
            before, clean = given, False
            try:
                replay = _new_lines(self.job_log_stream(job_id, attempt), already=before)
                for number, line in replay:
                    given = number
                    yield line
                clean = True
            except StreamNotOffered:
                yield from self._poll_log(job_id, attempt, given, poll_min, poll_max, sleep)
                return
            except ApiError as exc:
                if not _transient(exc):
                    raise
            except TransportError:
                pass
            try:
                ended = attempt_ended(self.get_job(job_id), attempt)
            except (ApiError, TransportError) as exc:
                failures += 1
                if not _transient(exc) or failures > max_transient_failures:
                    raise
                ended = False
            else:
                failures = 0
            if ended and clean:
                return
            quiet = 0 if given > before else quiet + 1
            sleep(min(poll_min * 2**quiet, poll_max))

    def _poll_log(self, job_id, attempt, given, poll_min, poll_max, sleep) -> Iterator[str]:
        """follow_log without a stream: re-read the text, give what is new."""
        interval = poll_min
        while True:
            ended = attempt_ended(self.get_job(job_id), attempt)
            lines = self.job_log(job_id, attempt).splitlines()
            yield from lines[given:]
            interval = poll_min if len(lines) > given else min(interval * 2, poll_max)
            given = max(given, len(lines))
            if ended:  # read after the end was seen: nothing comes after this text
                return
            sleep(interval)

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
                failures += 1
                if last is None or not _transient(exc) or failures > max_transient_failures:
                    raise
                wait = getattr(exc, "retry_after", None) or interval
                sleep(min(max(wait, poll_min), max(poll_max, RETRY_AFTER_CAP_S)))
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

    def download_result(self, job_id: str, destination: str | Path | None) -> Download:
        """Fetch the job's output: GET /v1/jobs/{id}/result, then its signed URL.

        destination: a file path; a folder (a path ending in "/", or an existing
        directory), where the file keeps its own name (output.gif), or
        <name>-<job id><ext> where that name is taken; or None: ./<job id><ext>. The
        file appears whole or not at all (written beside it, then renamed).
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


def _transient(exc: ApiError | TransportError) -> bool:
    """Whether waiting could help: no connection, rate limited, the server failing."""
    return isinstance(exc, TransportError) or exc.status == 429 or exc.status >= 500


def attempt_ended(job: dict, attempt: int) -> bool:
    """Whether the job is past its attempt number `attempt`: finished, requeued or on a
    later attempt."""
    status = job.get("status")
    later = (job.get("attempts") or 0) > attempt
    return status in TERMINAL_STATUSES or status == "queued" or later


def parse_sse(lines: Iterable[bytes]) -> Iterator[ServerEvent | None]:
    """Server-Sent Events from the lines of a stream (the WHATWG rules): `data` lines
    joined with newlines, one leading space after the colon dropped, an event dispatched
    by a blank line (so one cut short by a dropped connection never is); None for each
    comment line, the server's keep-alive."""
    event, data, event_id = "", [], None
    for raw in lines:
        line = raw.decode("utf-8", "replace")
        line = line[:-1] if line.endswith("\n") else line
        line = line[:-1] if line.endswith("\r") else line
        if not line:
            if data:
                yield ServerEvent(event or "message", "\n".join(data), event_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            yield None
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            event_id = value


def _new_lines(lines: Iterable[str], *, already: int) -> Iterator[tuple[int, str]]:
    """(line number, line) of a replayed log after its first `already` lines. A replay
    that starts with the server's "[... N lines skipped ...]" (its live buffer holds the
    latest lines only) goes on at line N + 1: what is lost is said once, not again."""
    position = 0
    for line in lines:
        skipped = _SKIPPED_LINES.match(line) if position == 0 else None
        if skipped:
            position = int(skipped.group(1))
            if position > already:
                yield position, f"[... {position - already} lines skipped ...]"
            continue
        position += 1
        if position > already:
            yield position, line


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


def _extension(name: str) -> str:
    ext = os.path.splitext(name)[1]
    return ext.lower() if 1 < len(ext) <= 10 and ext[1:].isalnum() else ""


def _own_name(url: str, headers: Message) -> str | None:
    """The output's own file name: Content-Disposition's, else the URL's last segment
    when it has an extension. Only a plain name: never a path, a hidden file or junk."""
    candidates = []
    disposition = headers.get_param("filename", header="Content-Disposition")
    if isinstance(disposition, str):
        candidates.append(disposition)
    candidates.append(unquote(urlsplit(url).path.rsplit("/", 1)[-1]))
    for candidate in candidates:
        name = candidate.replace("\\", "/").rsplit("/", 1)[-1].strip()
        printable = name.isprintable() and len(name) <= 255
        if name and printable and not name.startswith(".") and _extension(name):
            return name
    return None


def _default_name(url: str, headers: Message, job_id: str) -> str:
    """<job id> plus the output's extension: from its own name, else its content type."""
    ext = _extension(_own_name(url, headers) or "")
    if not ext:
        ctype = headers.get_content_type()
        ext = (
            mimetypes.guess_extension(ctype) if ctype != "application/octet-stream" else None
        ) or ".bin"
    return f"{job_id}{ext}"


def _target(destination: str | Path | None, *, url: str, headers: Message, job_id: str) -> Path:
    if destination is None:
        return Path.cwd() / _default_name(url, headers, job_id)
    text = str(destination)
    # Path() drops a trailing slash: it is read from the text, before any Path exists.
    if not (text.endswith(("/", os.sep)) or Path(text).is_dir()):
        return Path(text)
    folder = Path(text)
    name = _own_name(url, headers) or _default_name(url, headers, job_id)
    target = folder / name
    if target.exists() and not name.startswith(job_id):
        # Outputs are often named alike (every stand-in output is output.gif): a folder
        # of results must not lose one job's to the next.
        stem, ext = os.path.splitext(name)
        target = folder / f"{stem}-{job_id}{ext}"
    return target


def _save(answer, *, url: str, job_id: str, destination: str | Path | None) -> Download:
    target = _target(destination, url=url, headers=answer.headers, job_id=job_id)
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
