"""Benchmark: submissions with and without 1,000 open job streams, in one run.

    python bench/stream.py                 # 1,000 streams; a scratch database and server

Starts the API as `make up` does (gunicorn, uvicorn workers, config.asgi) on a scratch
database (bench/api.py's setup), submits --streams jobs (they stay queued: no
dispatcher runs) and then:

1. measures sustained POST /v1/jobs without streams (bench/api.py's closed-loop clients);
2. opens one `GET /v1/jobs/{id}/stream` per job from a separate process (asyncio, one
   connection each) and waits for every stream's first event;
3. measures the same submissions again with the streams open, and the API workers'
   resident memory before and after opening them (per open stream);
4. cancels --probes of the streamed jobs one at a time and measures, per job, the time
   from sending the cancel to its `cancelled` event arriving on the stream.

It prints the two rates and their ratio (target >= 80 %), memory per stream, and the
event latency p50 / p99.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api as api_bench
from _common import add_cpus_argument, begin_run, usable_cpus


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def submit_jobs(url: str, key: str, project: str, count: int) -> list[str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    ids = []
    body = json.dumps(dict(api_bench.JOB_BODY, project=project))
    for _ in range(count):
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": uuid.uuid4().hex,
        }
        conn.request("POST", "/v1/jobs", body, headers)
        response = conn.getresponse()
        payload = response.read()
        if response.status != 202:
            raise SystemExit(f"submission refused: {response.status} {payload[:200]!r}")
        ids.append(json.loads(payload)["id"])
    return ids


async def _follow(host, port, key, job_id, arrivals, connected):
    reader, writer = await asyncio.open_connection(host, port, limit=2**20)
    writer.write(
        f"GET /v1/jobs/{job_id}/stream HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    first = True
    while True:
        line = await reader.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            body = json.loads(line[6:])
            arrivals.append((job_id, body["status"], time.monotonic()))
            if first:
                connected.release()
                first = False
            if body["status"] in ("succeeded", "failed", "timed_out", "cancelled"):
                break
    writer.close()


def stream_process(url: str, key: str, job_ids: list[str], ready, stop, out) -> None:
    """Hold one stream per job until `stop`; report when all have their first event,
    then every event's (job, status, arrival time)."""
    parts = urlsplit(url)

    async def main():
        arrivals: list = []
        connected = asyncio.Semaphore(0)
        tasks = [
            asyncio.create_task(_follow(parts.hostname, parts.port, key, j, arrivals, connected))
            for j in job_ids
        ]
        for _ in job_ids:
            await connected.acquire()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        out.put(arrivals)

    asyncio.run(main())


def cancel_and_time(url: str, key: str, job_ids: list[str]) -> dict[str, float]:
    """Cancel each job; job id -> time.monotonic() just before the request was sent."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    sent = {}
    for job_id in job_ids:
        sent[job_id] = time.monotonic()
        conn.request(
            "POST", f"/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {key}"}
        )
        response = conn.getresponse()
        response.read()
        time.sleep(0.02)
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=200, help="cancels timed on the stream")
    parser.add_argument("--processes", type=int, default=2, help="submitting client processes")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--server-workers", type=int, default=3)
    parser.add_argument("--server-threads", type=int, default=4)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    add_cpus_argument(parser)
    args = parser.parse_args(argv)
    begin_run(
        "bench/stream.py",
        args.cpus,
        started_here=f"gunicorn (master and {args.server_workers} workers), "
        f"{args.processes} client processes, the stream holder, migrate and setup",
        database_url=api_bench.database_url(),
        redis_url=args.redis_url,
    )
    args.url, args.keep, args.worker_class = (
        None,
        False,
        "config.uvicorn_worker.GantryUvicornWorker",
    )
    args.orgs = args.processes * args.threads + 1
    server, info = api_bench.start_scratch_server(args)
    keys, project = info["keys"], info["project"]
    stream_key, load_keys = keys[-1], keys[:-1]
    stop = mp.Event()
    holder = None
    try:
        workers = api_bench.children_of(server.pid)
        print(
            f"server {args.url} (gunicorn uvicorn workers: {args.server_workers}); "
            f"{args.streams} streams; submissions by {args.processes} x {args.threads} "
            f"clients, {args.duration:g} s each; {usable_cpus()} CPUs usable"
        )
        job_ids = submit_jobs(args.url, stream_key, project, args.streams)
        without = api_bench.summarize(
            [api_bench.run_load(args, "submit", load_keys, project, server.pid, warmup=args.warmup)]
        )
        rss_before = rss_kib(workers)
        ready, out = mp.Event(), mp.Queue()
        holder = mp.Process(
            target=stream_process, args=(args.url, stream_key, job_ids, ready, stop, out)
        )
        opened = time.monotonic()
        holder.start()
        if not ready.wait(120):
            raise SystemExit("the streams did not all open within 120 s")
        open_s = time.monotonic() - opened
        time.sleep(2)
        rss_after = rss_kib(workers)
        with_streams = api_bench.summarize(
            [api_bench.run_load(args, "submit", load_keys, project, server.pid, warmup=args.warmup)]
        )
        probes = job_ids[: args.probes]
        sent = cancel_and_time(args.url, stream_key, probes)
        time.sleep(2)
        stop.set()
        arrivals = out.get(timeout=60)
        holder.join(timeout=30)
        # Again without: the queue grew meanwhile, and admission reads it; the baseline is
        # the mean of the runs before and after, so growth does not count against streams.
        after = api_bench.summarize(
            [api_bench.run_load(args, "submit", load_keys, project, server.pid, warmup=args.warmup)]
        )
    finally:
        stop.set()
        if holder is not None and holder.is_alive():
            holder.kill()
        api_bench.stop_server(server)
        api_bench.recreate_database(api_bench.database_url(), drop_only=True)
    seen = {job: t for job, status, t in arrivals if status == "cancelled"}
    latencies = sorted((seen[j] - sent[j]) * 1000 for j in probes if j in seen)
    runs = (
        ("without streams", without),
        (f"with {args.streams} open", with_streams),
        ("without, after", after),
    )
    for name, result in runs:  # CPU per submission: bench/api.py
        print(
            f"POST /v1/jobs {name:18s} {result['ok_per_s']:8.1f} ok/s  "
            f"p50 {result['p50_ms']:6.1f} ms  p99 {result['p99_ms']:6.1f} ms  "
            f"statuses {result['statuses']}"
        )
    baseline = (without["ok_per_s"] + after["ok_per_s"]) / 2
    ratio = with_streams["ok_per_s"] / baseline if baseline else 0.0
    print(f"rate with streams / without (mean of before and after): {ratio:.0%} (target >= 80 %)")
    print(f"{args.streams} streams opened in {open_s:.1f} s")
    per_stream = (rss_after - rss_before) / args.streams
    print(
        f"API workers' memory: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB "
        f"with the streams open: {per_stream:.1f} KiB per open stream"
    )
    if latencies:
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(
            f"transition -> SSE event (cancel sent -> `cancelled` received), "
            f"{len(latencies)} of {len(probes)} probes: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )
    else:
        print("transition -> SSE event: no cancelled event arrived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
