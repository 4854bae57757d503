"""Human-readable output: credits, tables, job details, the balance and the live status
of a job being followed."""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

MICRO = 1_000_000
KINDS = ("paid", "promo", "grant")
DASH = "-"


def credits(micro) -> str:
    """Micro-credits as credits with 6 decimals, exactly (integer arithmetic, no float)."""
    if micro is None or micro == "":
        return DASH
    try:
        value = int(micro)
    except (TypeError, ValueError):
        return str(micro)
    sign = "-" if value < 0 else ""
    whole, frac = divmod(abs(value), MICRO)
    return f"{sign}{whole}.{frac:06d}"


# "66667 µc" in a server message (a refusal, an event's reason): credits for people.
_MICRO_AMOUNT = re.compile(r"(?<![\w.])(-?\d+)\s?(?:µc|micro-credits?)(?!\w)")


def amounts_in_credits(text: str) -> str:
    """The text with every micro-credit amount it quotes written in credits."""
    if not text:
        return text
    return _MICRO_AMOUNT.sub(lambda m: f"{credits(m.group(1))} credits", text)


def parse_time(value) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def timestamp(value) -> str:
    """An API time as 'YYYY-MM-DD HH:MM:SS UTC' (the raw string if it does not parse)."""
    when = parse_time(value)
    if when is None:
        return str(value) if value else DASH
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def relative(value, now: datetime) -> str:
    when = parse_time(value)
    if when is None:
        return ""
    delta = (when - now).total_seconds()
    return f"in {duration(delta)}" if delta >= 0 else f"{duration(-delta)} ago"


def percent(progress) -> str:
    try:
        return f"{float(progress) * 100:.0f}%"
    except (TypeError, ValueError):
        return DASH


def table(headers: Sequence[str], rows: Sequence[Sequence], *, right: Sequence[int] = ()) -> str:
    """A plain-text table; columns whose index is in `right` are right-aligned."""
    cells = [[str(c) for c in headers]] + [[DASH if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def gpus(job: dict) -> str:
    resources = job.get("resources") or {}
    count = resources.get("gpu_count", "?")
    placed = job.get("gpu_type")
    if placed:
        return f"{count} x {placed}"
    allowed = resources.get("gpu_types") or []
    return f"{count} x {'/'.join(allowed) if allowed else 'any'}"


def project_label(job: dict, projects: Mapping[str, str] | None) -> str | None:
    """The job's project by name where known, else its id."""
    project = job.get("project")
    return (projects or {}).get(str(project), project) if project is not None else None


def job_detail(
    job: dict, projects: Mapping[str, str] | None = None, *, now: datetime | None = None
) -> str:
    """A job as label/value lines; a queued one also says where it stands in the queue,
    why it waits and when it should start (reckoned from `now`, the server's clock)."""
    resources = job.get("resources") or {}
    allowed = ", ".join(resources.get("gpu_types") or []) or "any type"
    if resources.get("min_gpu_memory_gb"):
        allowed += f"; at least {resources['min_gpu_memory_gb']} GB"
    count = resources.get("gpu_count", "?")
    placed = f"{count} x {job['gpu_type']}" if job.get("gpu_type") else f"{count}, not placed yet"
    status = job.get("status", "?")
    if status in ("running", "preempting") or job.get("progress"):
        status += f" ({percent(job.get('progress'))})"
    hold = job.get("hold") or {}
    error = job.get("error") or {}
    result = job.get("result") or {}
    rows = [
        ("Job", job.get("id")),
        ("Status", status),
        ("Tier", job.get("tier")),
        ("Project", project_label(job, projects)),
        ("GPUs", f"{placed}  (allowed: {allowed})"),
        ("Attempts", f"{job.get('attempts', 0)} ({job.get('preemptions', 0)} preemptions)"),
    ]
    queue = _queue_phrase(job, now or datetime.now(UTC))
    if queue:
        rows.append(("Queue", queue))
    if hold:
        rows.append(
            (
                "Credits",
                f"{credits(hold.get('amount'))} held, {credits(hold.get('charged'))} charged, "
                f"{credits(hold.get('refunded'))} refunded ({hold.get('state', '?')})",
            )
        )
    rows += [
        ("Created", timestamp(job.get("created_at"))),
        ("Started", timestamp(job.get("started_at"))),
        ("Finished", timestamp(job.get("finished_at"))),
    ]
    if error:
        message = amounts_in_credits(error.get("message") or "")
        rows.append(("Error", f"{error.get('code', '?')}: {message}"))
    if result:
        rows.append(("Result", f"ready, `gantry result {job.get('id')}` to download"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {DASH if v is None else v}" for label, v in rows)


def jobs_table(jobs: Sequence[dict], projects: Mapping[str, str] | None = None) -> str:
    rows = [
        (
            job.get("id"),
            job.get("status"),
            percent(job.get("progress")),
            project_label(job, projects),
            gpus(job),
            timestamp(job.get("created_at")),
        )
        for job in jobs
    ]
    return table(("ID", "STATUS", "PROGRESS", "PROJECT", "GPUS", "CREATED"), rows, right=(2,))


def events_table(events: Sequence[dict]) -> str:
    rows = [
        (
            timestamp(e.get("at")),
            e.get("from") or DASH,
            e.get("to"),
            amounts_in_credits(e.get("reason") or ""),
        )
        for e in events
    ]
    return table(("AT", "FROM", "TO", "REASON"), rows)


def _kind_amounts(balance: dict) -> dict[str, dict[str, int]]:
    """Available and held per kind, from by_kind (numbers or objects) and the buckets."""
    by_kind = balance.get("by_kind") or {}
    buckets = balance.get("buckets") or []
    kinds = list(KINDS) + sorted(
        {k for k in by_kind if k not in KINDS} | {b.get("kind") for b in buckets} - {*KINDS, None}
    )
    amounts = {}
    for kind in kinds:
        entry = by_kind.get(kind)
        mine = [b for b in buckets if b.get("kind") == kind]
        if isinstance(entry, dict):
            available = entry.get("available", entry.get("remaining"))
            held = entry.get("held")
        else:
            available, held = entry, None
        if available is None:
            available = sum(int(b.get("remaining") or 0) for b in mine)
        if held is None:
            held = sum(int(b.get("held") or 0) for b in mine)
        amounts[kind] = {"available": int(available or 0), "held": int(held or 0)}
    return amounts


def balance_view(balance: dict, *, now: datetime | None = None) -> str:
    # Expirations are relative to the server's clock when it says what time it is.
    now = now or parse_time(balance.get("as_of")) or datetime.now(UTC)
    amounts = _kind_amounts(balance)
    rows = [(kind, credits(a["available"]), credits(a["held"])) for kind, a in amounts.items()]
    total_available = balance.get("available", sum(a["available"] for a in amounts.values()))
    total_held = balance.get("held", sum(a["held"] for a in amounts.values()))
    rows.append(("total", credits(total_available), credits(total_held)))
    out = [table(("KIND", "AVAILABLE", "HELD"), rows, right=(1, 2))]

    expiring = balance.get("expiring_soon")
    if not expiring:
        expiring = [b for b in balance.get("buckets") or [] if b.get("expires_at")]
    expiring = sorted(expiring, key=lambda b: b.get("expires_at") or "")
    out.append("")
    if expiring:
        out.append("Upcoming expirations:")
        rows = [
            (
                b.get("kind"),
                credits(b.get("remaining", b.get("amount"))),
                timestamp(b.get("expires_at")),
                relative(b.get("expires_at"), now),
            )
            for b in expiring
        ]
        out.append(table(("KIND", "REMAINING", "EXPIRES", ""), rows, right=(1,)))
    else:
        out.append("No credits expire soon.")
    return "\n".join(out)


# -- the live status of a job being followed -----------------------------------------------

_PLACED = re.compile(r"placed on (?P<node>\S+) GPU [\d,]+ \((?P<gpu>[^)]+)\)")
_STARTED = re.compile(r"attempt \d+ (?:started|resumed) on (?P<node>\S+)")
# Why a job went back to the queue, from the reason of that event (first match wins).
_REQUEUE_CAUSES = (
    ("preempt", "preemption"),
    ("worker shut down", "worker shutdown"),
    ("worker", "worker loss"),
    ("out of gpu memory", "out-of-memory"),
    ("out of memory", "out-of-memory"),
    ("printed nothing", "hang"),
    ("hung", "hang"),
    ("killed by", "node fault"),
    ("crash", "crash"),
)
RUNNING = frozenset({"scheduled", "running", "preempting"})
TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


@dataclass(frozen=True)
class AttemptContext:
    """What the job's events tell that its body does not: where its latest attempt was
    placed, and why the job last went back to the queue."""

    node: str | None = None
    gpu_type: str | None = None
    requeued_after: str | None = None  # "preemption", "crash", ...


def requeue_cause(reason: str) -> str:
    lowered = reason.lower()
    return next((cause for marker, cause in _REQUEUE_CAUSES if marker in lowered), "failure")


def attempt_context(events: Iterable[dict]) -> AttemptContext:
    """The context of the latest attempt, from the job's events (oldest first)."""
    node = gpu = cause = None
    for event in events:
        reason = event.get("reason") or ""
        if placed := _PLACED.search(reason):
            node, gpu = placed["node"], placed["gpu"]
        elif started := _STARTED.search(reason):
            node = started["node"]
        if event.get("to") == "queued" and event.get("from") in RUNNING:
            cause = requeue_cause(reason)
    return AttemptContext(node=node, gpu_type=gpu, requeued_after=cause)


def _progress(job: dict) -> float:
    try:
        return min(1.0, max(0.0, float(job.get("progress") or 0.0)))
    except (TypeError, ValueError):
        return 0.0


def _attempt_phrase(job: dict, context: AttemptContext) -> str | None:
    """ "attempt 2 after preemption" while it runs; "retrying after crash" back in the queue."""
    attempts = job.get("attempts") or 0
    cause = context.requeued_after
    if job.get("status") == "queued":
        return f"retrying after {cause}" if attempts and cause else None
    if not attempts:
        return None
    return f"attempt {attempts} after {cause}" if attempts > 1 and cause else f"attempt {attempts}"


def _where(job: dict, context: AttemptContext) -> str | None:
    if job.get("status") == "queued":
        return None  # where an earlier attempt ran is no news for a waiting job
    node = job.get("node") or context.node
    gpu = job.get("gpu_type") or context.gpu_type
    if node and gpu:
        return f"on {node} ({gpu})"
    return f"on {node or gpu}" if node or gpu else None


def _queue_phrase(job: dict, now: datetime) -> str | None:
    queue = job.get("queue") if job.get("status") == "queued" else None
    if not isinstance(queue, dict):
        return None
    position, reason = queue.get("position"), queue.get("reason")
    text = f"#{position} in queue" if position else "in queue"
    if reason:
        text += f": {reason}"
    estimate = parse_time(queue.get("estimated_start_at"))
    if estimate is not None:
        ahead = (estimate - now).total_seconds()
        text += f", starts ~in {duration(ahead)}" if ahead >= 1 else ", starts ~now"
    return text


def _elapsed(job: dict, now: datetime) -> str | None:
    """Since submission, to its end once it has one (reckoned on the server's clock)."""
    created = parse_time(job.get("created_at"))
    if created is None:
        return None
    end = parse_time(job.get("finished_at")) if job.get("status") in TERMINAL else None
    return f"{duration(((end or now) - created).total_seconds())} elapsed"


def status_line(job: dict, context: AttemptContext, *, now: datetime) -> str:
    """One line of where a followed job stands: status and progress, attempt, node and GPU,
    its place in the queue, elapsed time and cost so far."""
    status = job.get("status", "?")
    progress = _progress(job)
    if status in RUNNING - {"scheduled"} or status == "succeeded" or progress > 0:
        status += f" {progress * 100:.0f}%"
    hold = job.get("hold") or {}
    cost = f"cost {credits(hold.get('charged') or 0)} credits" if hold else None
    parts = [
        status,
        _attempt_phrase(job, context),
        _where(job, context),
        _queue_phrase(job, now),
        _elapsed(job, now),
        cost,
    ]
    return " | ".join(part for part in parts if part)


def _news(job: dict, context: AttemptContext) -> tuple:
    """What makes a new line on a log: not the clock, the cost or the estimate ticking."""
    queue = job.get("queue") if isinstance(job.get("queue"), dict) else {}
    return (
        job.get("status"),
        int(_progress(job) * 100),
        _attempt_phrase(job, context),
        _where(job, context),
        queue.get("position"),
        queue.get("reason"),
    )


class StatusView:
    """A followed job on a terminal (one line, redrawn in place, its clock ticking) or on a
    log (a line for each change of status, whole percent, attempt, placement or queue
    place, so every step the server reports shows and nothing repeats)."""

    def __init__(
        self,
        stream: TextIO,
        *,
        job_id: str,
        now: Callable[[], datetime],
        bar_width: int = 20,
        tick_s: float | None = 1.0,
    ):
        self.stream = stream
        self.job_id = job_id
        self.now = now
        self.bar_width = bar_width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._tick_s = tick_s if self.tty else None
        self._state: tuple[dict, AttemptContext] | None = None
        self._last_news: tuple | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def update(self, job: dict, context: AttemptContext | None = None) -> None:
        context = context or AttemptContext()
        with self._lock:
            self._state = (job, context)
            if self.tty:
                self._draw()
            elif (news := _news(job, context)) != self._last_news:
                self._last_news = news
                line = status_line(job, context, now=self.now())
                self.stream.write(f"job {self.job_id}: {line}\n")
                self.stream.flush()
        if self._tick_s and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="gantry-status", daemon=True)
            self._ticker.start()

    def _draw(self) -> None:
        job, context = self._state
        filled = round(_progress(job) * self.bar_width)
        bar = "#" * filled + "-" * (self.bar_width - filled)
        line = f"[{bar}] {status_line(job, context, now=self.now())}"
        # A line longer than the terminal wraps, and \r would redraw only its last row.
        width = shutil.get_terminal_size((100, 24)).columns - 1
        self.stream.write(f"\r{line[:width]}\x1b[K")
        self.stream.flush()

    def _tick(self) -> None:
        # Between two events the elapsed time keeps moving on a terminal.
        while not self._stop.wait(self._tick_s):
            with self._lock:
                if self._state is not None and not self._stop.is_set():
                    self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            if self.tty and self._state is not None:
                self.stream.write("\n")
                self.stream.flush()
                self._state = None
