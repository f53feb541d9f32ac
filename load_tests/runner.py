"""Run a workload against one target: closed loop (fixed concurrency) or Poisson arrivals, bounded
by request count and duration; every request ends as a record.

Bounds: no request is issued after `duration_s` or beyond `num_requests`; an issued request ends
by `timeout_s` at the latest, so a run takes at most duration_s + timeout_s.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from .client import RequestRecord, check_loopback, stream_request
from .metrics import summarize
from .workloads import Workload, build_body

REPO = Path(__file__).resolve().parents[1]


def endpoint_url(target: str, w: Workload) -> str:
    return target.rstrip("/") + ("/v1/chat/completions" if w.endpoint == "chat" else "/v1/completions")


async def served_model(client: httpx.AsyncClient, target: str) -> str:
    r = await client.get(target.rstrip("/") + "/v1/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def arrival_times(w: Workload) -> list[float]:
    """Poisson arrival offsets (exponential gaps at `rate`), seeded, within the bounds."""
    rng = random.Random(f"{w.seed}:arrivals")
    out, t = [], 0.0
    while len(out) < w.num_requests:
        t += rng.expovariate(w.rate)
        if t > w.duration_s:
            break
        out.append(t)
    return out


async def run_workload(target: str, w: Workload, allow_remote: bool = False,
                       client: httpx.AsyncClient | None = None, with_text: bool = False) -> dict[str, Any]:
    """Run `w` against `target` (base URL, e.g. http://127.0.0.1:8000); returns the result dict
    (`conditions`, `workload`, `summary`, `records`; each record's streamed `text` if `with_text`)."""
    check_loopback(target, allow_remote)
    bound = w.concurrency or w.max_in_flight
    own = client is None
    if own:
        client = httpx.AsyncClient(timeout=httpx.Timeout(w.timeout_s, connect=10.0),
                                   limits=httpx.Limits(max_connections=bound + 8, max_keepalive_connections=bound))
    try:
        model = w.model or await served_model(client, target)
        url = endpoint_url(target, w)
        t_run = time.perf_counter()
        records: list[RequestRecord] = []

        async def one(i: int) -> None:
            rec = RequestRecord(index=i, start=time.perf_counter() - t_run)
            records.append(rec)
            await stream_request(client, url, build_body(w, i, model), rec, w.timeout_s)

        if w.concurrency is not None:
            counter = iter(range(w.num_requests))

            async def worker() -> None:
                for i in counter:
                    if time.perf_counter() - t_run > w.duration_s:
                        return
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(w.concurrency)))
        else:
            slots = asyncio.Semaphore(w.max_in_flight)
            tasks = []

            async def bounded(i: int) -> None:
                try:
                    await one(i)
                finally:
                    slots.release()

            for i, at in enumerate(arrival_times(w)):
                delay = at - (time.perf_counter() - t_run)
                if delay > 0:
                    await asyncio.sleep(delay)
                await slots.acquire()
                tasks.append(asyncio.create_task(bounded(i)))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t_run
    finally:
        if own:
            await client.aclose()
    records.sort(key=lambda r: r.index)
    return {"conditions": conditions(target, model), "workload": w.to_dict(),
            "summary": summarize(records, w.slo, wall), "records": [r.to_dict(with_text) for r in records]}


def conditions(target: str, model: str) -> dict[str, Any]:
    """Where and when a run happened: machine, commit, target."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    # uncommitted package changes at run time (others may edit the checkout while a run goes)
    dirty = [ln.split(None, 1)[-1] for ln in (git("status", "--porcelain", "--", "oscar_ray", "configs") or "").splitlines()]
    cpu = None
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), None)
    except OSError:
        pass
    return {"target": target, "model": model, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(dirty), "dirty_files": dirty,
            "host": platform.node(), "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "python": platform.python_version()}


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
