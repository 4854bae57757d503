"""The `gantry` command: submit and follow jobs, read the balance, from a terminal.

Exit status: 0 done; 1 the job ended failed, timed_out or cancelled; 2 bad usage or
configuration; 3 the API refused the request (4xx); 4 the API could not be reached,
failed (5xx) or answered something that is not the Gantry API; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import re
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from gantry_client import __version__, render
from gantry_client import config as configuration
from gantry_client.api import (
    TERMINAL_STATUSES,
    ApiError,
    GantryAPI,
    ProtocolError,
    Response,
    TransportError,
    next_cursor,
)
from gantry_client.render import AttemptContext

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERRUPTED = 130

STATUSES = ("queued", "scheduled", "running", "preempting", *sorted(TERMINAL_STATUSES))
RETRY_WAIT_CAP_S = 300.0
LIST_PAGE_MAX = 100
# Resolving a short id reads the whole listing: the biggest page the API serves.
SHORT_ID_PAGE_SIZE = 500
SHORT_ID_CANDIDATES_SHOWN = 10
FULL_JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
SHORT_JOB_ID = re.compile(r"^[0-9a-f][0-9a-f-]{0,34}$", re.I)

# Where a field named by a 400 comes from on the command line.
FIELD_FLAGS = {
    "project": "--project",
    "params": "--params-file / --param",
    "params.prompt": "--prompt",
    "params.seed": "--seed",
    "params.steps": "--steps",
    "params.step_seconds": "--step-seconds",
    "resources": "--gpus / --gpu-type / --min-gpu-memory-gb",
    "resources.gpu_count": "--gpus",
    "resources.gpu_types": "--gpu-type",
    "resources.min_gpu_memory_gb": "--min-gpu-memory-gb",
    "max_runtime_s": "--max-runtime",
    "preemptible": "--preemptible / --no-preemptible",
    "webhook_url": "--webhook-url",
    "Idempotency-Key": "--idempotency-key",
    "status": "--status",
    "limit": "--limit",
}


class UsageError(Exception):
    """Bad input caught before any request; the message says what to fix."""


class NoSuchJob(Exception):
    """A short job id that matches no job the key can see (like a 404 for a full id)."""


class JobUnsuccessful(Exception):
    def __init__(self, job: dict):
        super().__init__(job.get("status"))
        self.job = job


# -- argument types -----------------------------------------------------------------------

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")


def duration_seconds(text: str) -> int:
    """'600', '600s', '10m', '1h30m' as whole seconds."""
    match = _DURATION.match(text.strip().lower())
    if not text.strip() or not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 600, 10m or 1h30m)")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def key_value(text: str) -> tuple[str, object]:
    """k=v; v is read as JSON when it parses (7, 0.5, true, [1,2]), else as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


# -- the request body of a submission -----------------------------------------------------


def load_params_file(path: str) -> dict:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--params-file: cannot read {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--params-file: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--params-file: {path} must hold a JSON object of params")
    return data


def build_job_request(args: argparse.Namespace) -> dict:
    """The POST /v1/jobs body from the submit flags; unset flags are left to the server."""
    params = load_params_file(args.params_file) if args.params_file else {}
    for key, value in args.param or []:
        params[key] = value
    for key in ("prompt", "seed", "steps", "step_seconds"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value

    spec: dict = {"params": params}
    resources = {}
    if args.gpus is not None:
        resources["gpu_count"] = args.gpus
    if args.gpu_type:
        resources["gpu_types"] = args.gpu_type
    if args.min_gpu_memory_gb is not None:
        resources["min_gpu_memory_gb"] = args.min_gpu_memory_gb
    if resources:
        spec["resources"] = resources
    if args.project:
        spec["project"] = args.project
    if args.max_runtime is not None:
        spec["max_runtime_s"] = args.max_runtime
    if args.preemptible is not None:
        spec["preemptible"] = args.preemptible
    if args.webhook_url:
        spec["webhook_url"] = args.webhook_url
    return spec


# -- output -------------------------------------------------------------------------------


def out(text: str = "") -> None:
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def note(text: str) -> None:
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def dump(data) -> None:
    out(json.dumps(data, indent=2, sort_keys=True))


# -- commands -----------------------------------------------------------------------------


def make_api(args: argparse.Namespace) -> GantryAPI:
    settings = args.settings
    if not settings.api_key:
        raise UsageError(f"No API key. {configuration.HOW_TO_SET_KEY}")
    return GantryAPI(settings.api_url, settings.api_key, timeout=args.timeout)


def job_arg(api: GantryAPI, args: argparse.Namespace) -> str:
    """The JOB argument as a full id (a unique short id is resolved); error messages then
    name the full id too."""
    args.job = resolve_job_id(api, args.job)
    return args.job


def resolve_job_id(api: GantryAPI, text: str) -> str:
    """A full id as given (no request); a short id such as `b63fce7f` as the one job whose
    id ends or starts with it, from the listing of every job the key can see.

    Ids begin with their creation time (UUIDv7): jobs submitted the same minute share
    their first eight digits, and the end, which is random, is what tells them apart."""
    text = text.strip()
    if FULL_JOB_ID.match(text) or not SHORT_JOB_ID.match(text):
        return text  # ids are opaque to the API: anything but a hex part goes as is
    part = text.lower()
    matches = []
    for job in api.pages("/v1/jobs", {"limit": SHORT_ID_PAGE_SIZE}):
        job_id = str(job.get("id", "")).lower()
        if job_id.endswith(part) or job_id.startswith(part):
            matches.append(job)
            if len(matches) > SHORT_ID_CANDIDATES_SHOWN:
                break  # ambiguous already; no need to read the rest
    if not matches:
        raise NoSuchJob(
            f"No job {text}: no job id that this key can see ends or starts with {text}."
        )
    if len(matches) > 1:
        raise UsageError(ambiguous_short_id(text, matches))
    return str(matches[0]["id"])


def ambiguous_short_id(part: str, matches: list[dict]) -> str:
    shown = matches[:SHORT_ID_CANDIDATES_SHOWN]
    rows = [(j.get("id"), j.get("status"), render.timestamp(j.get("created_at"))) for j in shown]
    more = "more than " if len(matches) > SHORT_ID_CANDIDATES_SHOWN else ""
    table = "\n".join(
        f"  {line}" for line in render.table(("ID", "STATUS", "CREATED"), rows).splitlines()
    )
    return (
        f"The short job id {part} is ambiguous: it matches {more}{len(shown)} jobs.\n"
        f"{table}\nGive more of the id (its last digits tell jobs apart)."
    )


def project_names(api: GantryAPI) -> dict[str, str]:
    """Project id -> name, read once per run; {} (ids are shown) where it cannot be read:
    names are a convenience, never a reason to fail a command."""
    try:
        return api.project_names()
    except (ApiError, TransportError, ProtocolError):
        return {}


def submit_with_retry(
    api: GantryAPI, spec: dict, *, key: str, retries: int, others: Sequence[GantryAPI] = ()
) -> tuple[Response, GantryAPI]:
    """Submit; the answer and the API host that gave it. Without an answer from one API
    host (a lost connection), resend at once to the next of `others`; on 429, 5xx or
    when every host was tried, wait and resend, up to `retries` times.

    Resending is safe, to the same host or another, because the server replays the first
    answer for a key: the same job, held once.
    """
    hosts = [api, *others]
    attempt, current, untried = 0, 0, len(hosts) - 1
    while True:
        try:
            return hosts[current].submit_job(spec, idempotency_key=key), hosts[current]
        except (ApiError, TransportError) as exc:
            transient = isinstance(exc, TransportError) or exc.status == 429 or exc.status >= 500
            if isinstance(exc, TransportError) and untried:
                untried -= 1
                nxt = (current + 1) % len(hosts)
                note(
                    f"no answer from {hosts[current].base_url}; resending to "
                    f"{hosts[nxt].base_url} with the same Idempotency-Key"
                )
                current = nxt
                continue
            if not transient or attempt >= retries:
                raise
            untried = len(hosts) - 1
            attempt += 1
            wait = getattr(exc, "retry_after", None)
            wait = min(wait if wait is not None else 2.0**attempt, RETRY_WAIT_CAP_S)
            reason = "rate limited" if getattr(exc, "status", 0) == 429 else "server unavailable"
            note(f"{reason}; retrying in {wait:.0f} s (retry {attempt} of {retries})")
            time.sleep(wait)


def cmd_submit(args: argparse.Namespace) -> int:
    spec = build_job_request(args)
    api = make_api(args)
    key = args.idempotency_key or str(uuid.uuid4())
    # Printed first, so that after a crash or a dropped connection the retry can reuse it.
    note(f"Idempotency-Key: {key}  (pass it as --idempotency-key to retry without a duplicate)")
    others = [
        GantryAPI(url, api.api_key, timeout=api.timeout) for url in args.settings.api_urls[1:]
    ]
    response, api = submit_with_retry(api, spec, key=key, retries=args.retry, others=others)
    job = response.data
    args.following = job.get("id")
    if response.replayed:
        note("This key was used before: the server answered with the job it already made.")
    if not args.wait:
        if args.json:
            dump(job)
        else:
            held = (job.get("hold") or {}).get("amount")
            out(
                f"Submitted job {job.get('id')} ({job.get('status')}), "
                f"holding {render.credits(held)} credits."
            )
            out(f"Follow it: gantry status {job.get('id')}")
        return EXIT_OK
    if not args.json:
        out(f"Submitted job {job.get('id')} ({job.get('status')}).")
    return finish_waiting(api, job["id"], args)


def follow_job(api: GantryAPI, job_id: str, args: argparse.Namespace) -> dict:
    """Follow the job (its event stream, else polls) to its end, showing its status."""
    job: dict = {"id": job_id}
    view = (
        None
        if args.no_progress
        else render.StatusView(sys.stderr, job_id=job_id, now=api.server_now)
    )
    context, moment = AttemptContext(), None
    try:
        for job in api.watch(job_id, poll_max=args.poll_max):
            if view is None:
                continue
            # Events are read again only when an attempt may have begun or ended.
            if (job.get("status"), job.get("attempts")) != moment:
                moment = (job.get("status"), job.get("attempts"))
                context = attempt_context(api, job, context)
            view.update(job, context)
    finally:
        if view is not None:
            view.close()
    return job


def attempt_context(api: GantryAPI, job: dict, previous: AttemptContext) -> AttemptContext:
    """Node, GPU and the latest requeue's cause, from the job's events; the previous
    context when they cannot be read (they only add to the status line)."""
    if not job.get("attempts"):
        return AttemptContext()
    try:
        return render.attempt_context(api.job_events(job["id"]))
    except (ApiError, TransportError, ProtocolError):
        return previous


def finish_waiting(api: GantryAPI, job_id: str, args: argparse.Namespace) -> int:
    job = follow_job(api, job_id, args)
    args.following = None
    if job.get("status") != "succeeded":
        raise JobUnsuccessful(job)
    download = api.download_result(job["id"], args.output)
    if args.json:
        dump({"job": job, "result_file": str(download.path), "bytes": download.size})
    else:
        hold = job.get("hold") or {}
        out(f"Job {job['id']} succeeded; charged {render.credits(hold.get('charged'))} credits.")
        out(f"Result saved to {download.path} ({download.size} bytes).")
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    api = make_api(args)
    args.following = job_arg(api, args)
    return finish_waiting(api, args.job, args)


def cmd_status(args: argparse.Namespace) -> int:
    api = make_api(args)
    job = api.get_job(job_arg(api, args))
    if args.json:
        dump(job)
    else:
        out(render.job_detail(job, project_names(api), now=api.server_now()))
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    api = make_api(args)
    limit = None if args.all else args.limit
    jobs: list[dict] = []
    cursor = None
    while limit is None or len(jobs) < limit:
        # The last page asks for just what is missing, so `next` never skips a job.
        size = args.page_size if limit is None else min(args.page_size, limit - len(jobs))
        page = api.list_jobs(status=args.status, project=args.project, limit=size, cursor=cursor)
        jobs.extend(page.get("results", [])[:size])
        cursor = next_cursor(page)
        if not cursor:
            break
    if args.json:
        dump({"results": jobs, "next": cursor})
        return EXIT_OK
    if not jobs:
        out("No jobs.")
    else:
        out(render.jobs_table(jobs, project_names(api)))
    if cursor:
        note(f"(first {len(jobs)} shown: --limit N for more, --all for every job)")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    api = make_api(args)
    job = api.cancel_job(job_arg(api, args))
    if args.json:
        dump(job)
    elif job.get("status") == "cancelled":
        out(f"Cancelled job {job.get('id')}.")
        hold = job.get("hold") or {}
        if hold:
            out(
                f"Charged {render.credits(hold.get('charged'))}, "
                f"refunded {render.credits(hold.get('refunded'))} credits."
            )
    else:
        out(
            f"Cancellation requested: job {job.get('id')} is {job.get('status')} and stops "
            "shortly; only the time it ran is charged."
        )
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    api = make_api(args)
    events = api.job_events(job_arg(api, args))
    if args.json:
        dump({"results": events})
    else:
        out(render.events_table(events) if events else "No events.")
    return EXIT_OK


def cmd_balance(args: argparse.Namespace) -> int:
    balance = make_api(args).balance()
    if args.json:
        dump(balance)
    else:
        out(render.balance_view(balance))
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    api = make_api(args)
    job = api.get_job(job_arg(api, args))  # a clear "no such job" before any log request
    if not args.follow:
        text = api.job_log(args.job, args.attempt)
        sys.stdout.write(text if not text or text.endswith("\n") else f"{text}\n")
        sys.stdout.flush()
        if not text:
            note(
                f"(job {args.job} has printed nothing{' in that attempt' if args.attempt else ''})"
            )
        return EXIT_OK
    args.following, args.follow_again = args.job, f"gantry logs -f {args.job}"
    attempt = args.attempt or job.get("attempts") or 0
    if not attempt:
        job = wait_for_first_attempt(api, job, args)
        attempt = job.get("attempts") or 0
    if not attempt:
        note(f"gantry: job {args.job} ended {job.get('status')} before any attempt: no logs.")
        return EXIT_JOB_FAILED
    # The attempt number is fixed now: a retry's log is not mixed into this one's.
    for line in api.follow_log(args.job, attempt, poll_max=args.poll_max):
        out(line)
    return EXIT_OK


def wait_for_first_attempt(api: GantryAPI, job: dict, args: argparse.Namespace) -> dict:
    note(f"Job {args.job} is {job.get('status')}: waiting for its first attempt to start.")
    with contextlib.closing(api.watch(args.job, poll_max=args.poll_max)) as snapshots:
        for job in snapshots:
            if job.get("attempts") or job.get("status") in TERMINAL_STATUSES:
                break
    return job


def cmd_result(args: argparse.Namespace) -> int:
    api = make_api(args)
    download = api.download_result(job_arg(api, args), args.output)
    if args.json:
        dump({"result_file": str(download.path), "bytes": download.size})
    else:
        out(f"Result saved to {download.path} ({download.size} bytes).")
    return EXIT_OK


def cmd_configure(args: argparse.Namespace) -> int:
    path = configuration.config_path()
    if args.show:
        settings = args.settings
        out(f"API URL     {settings.api_url}  (from {settings.url_source})")
        out(
            f"API key     {configuration.mask_key(settings.api_key)}"
            + (f"  (from {settings.key_source})" if settings.key_source else "")
        )
        out(f"Config file {path}{'' if path.exists() else ' (none yet)'}")
        return EXIT_OK
    url, key = args.api_url, args.api_key
    if url is None and key is None:
        if not sys.stdin.isatty():
            raise UsageError("Nothing to store: pass --api-url URL and/or --api-key KEY.")
        current = args.settings.api_url
        url = input(f"API URL [{current}]: ").strip() or current
        key = (
            getpass.getpass("API key (input hidden, empty keeps the current one): ").strip() or None
        )
    configuration.write_file(path, api_url=url, api_key=key)
    out(f"Saved to {path} (readable by you only).")
    return EXIT_OK


# -- error messages -----------------------------------------------------------------------


def explain_api_error(exc: ApiError, args: argparse.Namespace) -> str:
    job = getattr(args, "job", None)
    command = getattr(args, "command", "")
    settings = args.settings
    # Server messages quote amounts in micro-credits ("66667 µc"): people read credits.
    text = render.amounts_in_credits(exc.message)
    message = text.rstrip(".") + "." if text else ""

    if exc.status == 400:
        text = f"Invalid request: {message}"
        if exc.field:
            flag = FIELD_FLAGS.get(exc.field)
            if flag is None and exc.field.startswith("params."):
                flag = f"--param {exc.field.removeprefix('params.')}=..."
            text += f"\n  field: {exc.field}" + (f"  (set with {flag})" if flag else "")
        return text
    if exc.status == 401:
        if settings.api_key:
            who = f"The key {configuration.mask_key(settings.api_key)} (from {settings.key_source})"
            problem = f"{who} was refused by {settings.api_url}: it is unknown or revoked."
        else:
            problem = f"No API key was sent to {settings.api_url}."
        return f"Not authenticated: {message}\n{problem}\n{configuration.HOW_TO_SET_KEY}"
    if exc.status == 402:
        # Our server's message already says so; another's may not.
        said = message.lower().startswith("not enough credit")
        lines = [message if said else f"Not enough credits: {message}"]
        for name, value in sorted(exc.details.items()):
            if isinstance(value, int) and not isinstance(value, bool):
                lines.append(f"  {name.replace('_', ' ')}: {render.credits(value)} credits")
        lines.append("See `gantry balance`; lower --max-runtime or --gpus to hold less.")
        return "\n".join(lines)
    if exc.status == 403:
        if exc.code == "budget_exceeded":
            return f"A hard budget would be exceeded: {message}"
        return f"Forbidden: {message} This key may not do that."
    if exc.status == 404:
        if command == "logs" and "/logs" in urlsplit(exc.url).path:
            if exc.message.startswith("No such endpoint"):
                return (
                    f"The server at {settings.api_url} has no job logs ({exc.method} "
                    f"{urlsplit(exc.url).path} is not a route there): it is older than this client."
                )
            return f"No log for job {job}: {message}"
        if command == "result":
            return (
                f"No result for job {job}: {message} A result exists once the job has "
                f"succeeded; see `gantry status {job}`."
            )
        if job:
            return f"No job {job}: it does not exist, or it belongs to another org."
        return f"Not found: {message} ({exc.method} {exc.url})"
    if exc.status == 409:
        if exc.code == "idempotency_mismatch" or exc.field == "Idempotency-Key":
            return (
                f"Conflict: {message} This Idempotency-Key belongs to a different submission; "
                "leave out --idempotency-key to use a fresh one."
            )
        if command == "cancel":
            return f"Cannot cancel job {job}: {message}"
        if command == "result":
            return f"No result for job {job} yet: {message} See `gantry status {job}`."
        return f"Conflict: {message}"
    if exc.status == 429:
        wait = f" Retry after {exc.retry_after:.0f} s." if exc.retry_after is not None else ""
        hint = ""
        if command == "submit" and not getattr(args, "retry", 0):
            hint = "\nPass --retry N to wait and resubmit automatically (same Idempotency-Key)."
        return f"Rate limited: {message}{wait}{hint}"
    if exc.status >= 500:
        return (
            f"The server failed (HTTP {exc.status} {exc.code}): {message}\n"
            f"Request id {exc.request_id}. Try again later; if it persists, report the request id."
        )
    field = f"\n  field: {exc.field}" if exc.field else ""
    return f"The API refused the request (HTTP {exc.status} {exc.code}): {message}{field}"


def explain_transport_error(exc: TransportError, args: argparse.Namespace) -> str:
    settings = args.settings
    reasons = {
        "refused": "connection refused: is the server running there?",
        "dns": "the host name does not resolve",
        "timeout": f"no answer within {args.timeout:g} s",
    }
    reason = reasons.get(exc.kind, exc.reason)
    return (
        f"Cannot reach the Gantry API at {settings.api_url} ({reason}).\n"
        f"Tried {exc.url}; the URL came from {settings.url_source}.\n"
        f"{configuration.HOW_TO_SET_URL}"
    )


def explain_protocol_error(exc: ProtocolError, args: argparse.Namespace) -> str:
    return (
        f"{exc.url} did not answer like the Gantry API (HTTP {exc.status}): {exc.problem}.\n"
        f"Is {args.settings.api_url} the Gantry API? {configuration.HOW_TO_SET_URL}"
    )


# -- the parser ---------------------------------------------------------------------------


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # Also on every subcommand, so `gantry status JOB --json` works; SUPPRESS there keeps
    # a value given before the subcommand.
    def default(value):
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("connection and output")
    group.add_argument(
        "--api-url",
        default=default(None),
        help="API base URL, or several API hosts separated by commas: a submission that "
        "gets no answer is resent to the next with the same key (env GANTRY_API_URL)",
    )
    group.add_argument("--api-key", default=default(None), help="API key (env GANTRY_API_KEY)")
    group.add_argument(
        "--json", action="store_true", default=default(False), help="print the raw API JSON"
    )
    group.add_argument(
        "--timeout",
        type=positive_float,
        default=default(30.0),
        metavar="S",
        help="seconds to wait for each HTTP answer (default 30)",
    )


def _wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="result file, or a folder (ending in / or existing) where it keeps its own name "
        "(default ./<job id>.<ext>)",
    )
    _poll_option(parser)
    parser.add_argument("--no-progress", action="store_true", help="no status line")


def _poll_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--poll-max",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="longest pause between two reads when the live stream is unavailable or "
        "keeps dropping, while nothing changes (default 10)",
    )


JOB_HELP = "a job id, or its last (or first) digits where no other job's id has them (b63fce7f)"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, suppress=True)

    parser = argparse.ArgumentParser(
        prog="gantry",
        description="Submit GPU jobs to Gantry and follow them. "
        "Configure with --api-url/--api-key, GANTRY_API_URL/GANTRY_API_KEY "
        "or `gantry configure`.",
    )
    parser.add_argument("--version", action="version", version=f"gantry {__version__}")
    _common_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, handler, help_text):
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    submit = command("submit", cmd_submit, "submit a job (and with --wait, follow it)")
    p = submit.add_argument_group("params (merged: --params-file, then --param, then the rest)")
    p.add_argument(
        "--params-file", metavar="FILE.json", help="a JSON object of params ('-': stdin)"
    )
    p.add_argument(
        "--param",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="one param; VALUE is JSON when it parses (repeatable)",
    )
    p.add_argument("--prompt")
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--step-seconds", dest="step_seconds", type=float)
    r = submit.add_argument_group("resources")
    r.add_argument("--gpus", type=int, metavar="N", help="GPU count (1-8)")
    r.add_argument(
        "--gpu-type",
        action="append",
        metavar="TYPE",
        help="allowed GPU type, most preferred first (repeatable; default: any)",
    )
    r.add_argument("--min-gpu-memory-gb", type=int, metavar="GB")
    r.add_argument(
        "--max-runtime", type=duration_seconds, metavar="DURATION", help="e.g. 600, 10m, 1h30m"
    )
    r.add_argument(
        "--preemptible",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="may be preempted",
    )
    r.add_argument("--project", help="project id or name (default: the key's or the org's)")
    r.add_argument("--webhook-url", metavar="URL", help="https URL told of the terminal status")
    s = submit.add_argument_group("submission")
    s.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="reuse the key printed by an earlier try to retry it safely (default: a new uuid4)",
    )
    s.add_argument(
        "--retry",
        type=int,
        default=0,
        metavar="N",
        help="on 429 (after Retry-After), 5xx or a lost connection, resend up to N times",
    )
    s.add_argument("--wait", action="store_true", help="follow the job and download its result")
    _wait_options(s)

    status = command("status", cmd_status, "show a job")
    status.add_argument("job", metavar="JOB", help=JOB_HELP)

    wait = command("wait", cmd_wait, "follow a job to its end and download its result")
    wait.add_argument("job", metavar="JOB", help=JOB_HELP)
    _wait_options(wait)

    listing = command("list", cmd_list, "list jobs, newest first")
    listing.add_argument("--status", choices=STATUSES)
    listing.add_argument("--project", help="project id or name")
    listing.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="how many (default 20)"
    )
    listing.add_argument("--all", action="store_true", help="every job (follows all pages)")
    listing.add_argument(
        "--page-size",
        type=positive_int,
        default=LIST_PAGE_MAX,
        metavar="N",
        help=f"jobs per request (default {LIST_PAGE_MAX})",
    )

    cancel = command("cancel", cmd_cancel, "cancel a job")
    cancel.add_argument("job", metavar="JOB", help=JOB_HELP)

    events = command("events", cmd_events, "a job's status changes, oldest first")
    events.add_argument("job", metavar="JOB", help=JOB_HELP)

    command("balance", cmd_balance, "credits by kind, held amounts and upcoming expirations")

    result = command("result", cmd_result, "download a finished job's output")
    result.add_argument("job", metavar="JOB", help=JOB_HELP)
    result.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file, or a folder (ending in / or existing) where it keeps its own name "
        "(default ./<job id>.<ext>)",
    )

    logs = command("logs", cmd_logs, "what the generator printed (stdout and stderr) in an attempt")
    logs.add_argument("job", metavar="JOB", help=JOB_HELP)
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print lines as they come, until the attempt ends",
    )
    logs.add_argument(
        "--attempt", type=positive_int, metavar="N", help="which attempt (default: the latest)"
    )
    _poll_option(logs)

    configure = command(
        "configure",
        cmd_configure,
        "store the API URL and key in the config file (--api-url/--api-key, or asked)",
    )
    configure.add_argument("--show", action="store_true", help="show the settings in effect")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.following = None
    args.follow_again = None
    try:
        args.settings = configuration.resolve(api_url=args.api_url, api_key=args.api_key)
        return args.handler(args)
    except (UsageError, configuration.ConfigError) as exc:
        note(f"gantry: error: {exc}")
        return EXIT_USAGE
    except ApiError as exc:
        note(f"gantry: {explain_api_error(exc, args)}")
        if args.json and exc.body:
            dump({"status": exc.status, **exc.body})
        return EXIT_REFUSED if exc.status < 500 else EXIT_UNAVAILABLE
    except NoSuchJob as exc:
        note(f"gantry: {exc}")
        return EXIT_REFUSED
    except TransportError as exc:
        note(f"gantry: {explain_transport_error(exc, args)}")
        return EXIT_UNAVAILABLE
    except ProtocolError as exc:
        note(f"gantry: {explain_protocol_error(exc, args)}")
        return EXIT_UNAVAILABLE
    except JobUnsuccessful as exc:
        job = exc.job
        error = job.get("error") or {}
        message = render.amounts_in_credits(error.get("message") or "")
        detail = f": {error.get('code')}: {message}" if error else ""
        note(f"gantry: job {job.get('id')} ended {job.get('status')}{detail}")
        if args.json:
            dump(job)
        return EXIT_JOB_FAILED
    except KeyboardInterrupt:
        if args.following:
            again = args.follow_again or f"gantry wait {args.following}"
            note(
                f"\nStopped following job {args.following}; it keeps running. "
                f"Follow it again with `{again}`, "
                f"stop it with `gantry cancel {args.following}`."
            )
        return EXIT_INTERRUPTED
