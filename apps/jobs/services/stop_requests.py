"""Telling a running attempt's worker at once that its job should stop.

A cancel or a preemption is written to PostgreSQL (the job's `cancel_requested`, or
running → preempting; or the job is ended under its runner, its credit hold expired),
which the attempt's runner reads on its next heartbeat
(GANTRY_HEARTBEAT_S). So that the generator is stopped within a fraction of a second
instead, the change also publishes a nudge on the job's stop channel once it commits
(`announce_stop_requested`); the runner listens there while it supervises the attempt
(`watch`) and, nudged, heartbeats at once. The nudge carries nothing but "look now":
the heartbeat's read of the database decides, as before, so a lost nudge (Redis down, a
listener that subscribed late) only means the stop waits for the next heartbeat.

A worker process holds one Redis connection for all the attempts it runs
(core.pubsub.ThreadChannelHub): one listener thread subscribes each watched job's
channel and drops it when the attempt ends.
"""

from __future__ import annotations

from apps.core.pubsub import ThreadChannelHub
from apps.core.redis import publish_on_commit


def channel_of(job_id) -> str:
    return f"gantry:job-stop:{job_id}"


def announce_stop_requested(job_id) -> None:
    """Nudge the runner of the job's attempt once the current transaction commits (at
    once outside one). Best effort: without Redis the runner stops at its next heartbeat."""
    publish_on_commit(channel_of(job_id), b"stop")


# This process's subscriptions, for every attempt its threads run.
_hub = ThreadChannelHub()


def watch(job_id):
    """An event set whenever the job's stop is announced, for as long as the block runs
    (ThreadChannelHub.watch: it waits up to a second for the subscription, so that a
    stop announced after this returns is heard; without Redis it goes on unsubscribed,
    and the heartbeats decide)."""
    return _hub.watch(channel_of(job_id))
