"""Whether a node's worker pool is alive, and what its GPUs report.

Every GPU-pool worker publishes a pulse for each node it serves (the queues `node.<name>`
it consumes) every `GANTRY_WORKER_PULSE_S`: its host name, process id and, where the
host has NVIDIA's management library (nvidia-ml-py over the driver's NVML), each GPU's
utilisation, memory and temperature. A pulse lives three periods in Redis, so a node
whose worker died or lost its link shows "no worker" within that time. Reading it is
one MGET for the whole fleet page.

A node whose worker pulsed once and went silent (`silent_nodes`: the pulse expired, the
"seen" mark without expiry is still there) gets no new placements: its host died or lost
its link, and work sent there would wait for the claim lease to run out. A node never
seen (no worker started yet, a fresh Redis) is not held back.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

import pynvml
import redis
from django.conf import settings

from apps.core.redis import redis_client

logger = logging.getLogger(__name__)

KEY = "gantry:node-pulse:{}"
SEEN_KEY = "gantry:node-seen:{}"  # no expiry: a worker served this node once


@dataclass(frozen=True)
class Pulse:
    worker: str
    host: str
    pid: int
    at: float  # unix time of the pulse
    gpus: list[dict] | None  # NVML readings, None: no telemetry on that host

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (now or time.time()) - self.at)


def gpu_telemetry() -> list[dict] | None:
    """Each GPU's utilisation (%), memory used and total (MiB) and temperature (°C), by
    NVML; None where the host has no NVIDIA driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append(
                {
                    "index": index,
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "utilisation_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_used_mib": memory.used // 2**20,
                    "memory_total_mib": memory.total // 2**20,
                    "temperature_c": pynvml.nvmlDeviceGetTemperature(
                        handle, pynvml.NVML_TEMPERATURE_GPU
                    ),
                }
            )
        return readings
    except pynvml.NVMLError as exc:
        logger.warning("GPU telemetry failed: %s", exc)
        return None
    finally:
        pynvml.nvmlShutdown()


def publish_pulse(nodes: list[str], *, worker: str) -> None:
    """One pulse for each of `nodes` (best effort: Redis away only hides liveness)."""
    pulse = {
        "worker": worker,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "at": time.time(),
        "gpus": gpu_telemetry(),
    }
    ttl = max(1, int(3 * settings.GANTRY_WORKER_PULSE_S))
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            for node in nodes:
                pipe.set(KEY.format(node), json.dumps(pulse), ex=ttl)
                pipe.set(SEEN_KEY.format(node), pulse["at"])
            pipe.execute()
    except redis.RedisError as exc:
        logger.warning("node pulse not published: %s", exc)


def pulses(nodes: list[str]) -> dict[str, Pulse]:
    """node name -> its latest pulse, for the nodes that have a live one."""
    if not nodes:
        return {}
    try:
        values = redis_client().mget([KEY.format(node) for node in nodes])
    except redis.RedisError:
        return {}
    return {node: Pulse(**json.loads(raw)) for node, raw in zip(nodes, values, strict=True) if raw}


def silent_nodes(nodes: list[str]) -> set[str]:
    """The nodes among `nodes` whose worker was seen and pulses no more (see the module
    docstring); empty when Redis cannot be read (liveness then holds nothing back)."""
    if not nodes:
        return set()
    try:
        values = redis_client().mget(
            [KEY.format(node) for node in nodes] + [SEEN_KEY.format(node) for node in nodes]
        )
    except redis.RedisError:
        return set()
    pulse, seen = values[: len(nodes)], values[len(nodes) :]
    return {node for node, p, s in zip(nodes, pulse, seen, strict=True) if s and not p}


def start_pulsing(nodes: list[str], *, worker: str) -> threading.Thread | None:
    """Pulse for `nodes` from a daemon thread of this worker process, until it exits."""
    if not nodes:
        return None

    def beat():
        while True:
            publish_pulse(nodes, worker=worker)
            time.sleep(settings.GANTRY_WORKER_PULSE_S)

    thread = threading.Thread(target=beat, name="node-pulse", daemon=True)
    thread.start()
    return thread
