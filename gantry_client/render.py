"""Human-readable output: credits, tables, job details, the balance and a progress bar."""

from __future__ import annotations

import time
from collections.abc import Sequence
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


def job_detail(job: dict) -> str:
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
        ("Project", job.get("project")),
        ("GPUs", f"{placed}  (allowed: {allowed})"),
        ("Attempts", f"{job.get('attempts', 0)} ({job.get('preemptions', 0)} preemptions)"),
    ]
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
        rows.append(("Error", f"{error.get('code', '?')}: {error.get('message', '')}"))
    if result:
        rows.append(("Result", f"ready, `gantry result {job.get('id')}` to download"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {DASH if v is None else v}" for label, v in rows)


def jobs_table(jobs: Sequence[dict]) -> str:
    rows = [
        (
            job.get("id"),
            job.get("status"),
            percent(job.get("progress")),
            job.get("project"),
            gpus(job),
            timestamp(job.get("created_at")),
        )
        for job in jobs
    ]
    return table(("ID", "STATUS", "PROGRESS", "PROJECT", "GPUS", "CREATED"), rows, right=(2,))


def events_table(events: Sequence[dict]) -> str:
    rows = [
        (timestamp(e.get("at")), e.get("from") or DASH, e.get("to"), e.get("reason") or "")
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


class ProgressBar:
    """Status and progress of a job on a terminal (redrawn in place) or a log (a line a step).

    On a non-terminal stream it prints a line only when the status changes or progress
    crosses another tenth, so logs stay short.
    """

    def __init__(self, stream: TextIO, *, job_id: str, width: int = 30):
        self.stream = stream
        self.job_id = job_id
        self.width = width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self._last_line: tuple | None = None
        self._drawn = False

    def update(self, job: dict) -> None:
        status = job.get("status", "?")
        try:
            progress = min(1.0, max(0.0, float(job.get("progress") or 0.0)))
        except (TypeError, ValueError):
            progress = 0.0
        elapsed = duration(time.monotonic() - self.started)
        filled = round(progress * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {progress * 100:3.0f}%  {status:<10}  {elapsed}"
        if self.tty:
            self.stream.write(f"\r{line}\x1b[K")
            self.stream.flush()
            self._drawn = True
            return
        step = (status, int(progress * 10))
        if step != self._last_line:
            self._last_line = step
            self.stream.write(f"job {self.job_id}: {line}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
