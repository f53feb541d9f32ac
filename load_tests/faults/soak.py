"""Soak: N concurrent streams (default 200) for D seconds (default 300) against the CPU default;
pass = 0 errors, no hung connection (every stream ends before its timeout), replica RSS flat.

    python -m load_tests.faults.soak --out load_tests/results/faults/soak.json

RSS of the engine replica is sampled every 5 s; "flat" = the mean of the last fifth of the run is
within 10% of the mean of the second fifth (the first fifth is warm-up: allocator pools, caches).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from load_tests.runner import run_workload
from load_tests.workloads import Workload

from .serving import engine_kv, replica_processes, save, serve_cpu_default


async def _sample_rss(app: str, stop: asyncio.Event, out: list) -> None:
    t0 = time.perf_counter()
    while not stop.is_set():
        rss = sum(p.memory_info().rss for p in replica_processes(app))
        out.append((round(time.perf_counter() - t0, 1), rss))
        try:
            await asyncio.wait_for(stop.wait(), 5.0)
        except TimeoutError:
            pass


async def soak(url: str, app: str, streams: int, duration_s: float, timeout_s: float) -> dict:
    w = Workload.from_dict({
        "name": "soak", "kind": "random_short", "concurrency": streams, "duration_s": duration_s,
        "num_requests": 10**6, "timeout_s": timeout_s, "sampling": {"max_tokens": 16, "temperature": 0.7},
        "prompt": {"min_words": 4, "max_words": 24}})
    stop, rss = asyncio.Event(), []
    sampler = asyncio.create_task(_sample_rss(app, stop, rss))
    try:
        res = await run_workload(url, w)
    finally:
        stop.set()
        await sampler
    n = len(rss)
    second = [r for _, r in rss[n // 5: 2 * n // 5]] or [rss[0][1]]
    last = [r for _, r in rss[4 * n // 5:]] or [rss[-1][1]]
    growth = (sum(last) / len(last)) / (sum(second) / len(second)) - 1
    s = res["summary"]
    res["rss_samples"] = rss
    res["verdict"] = {
        "errors": sum(s["errors"].values()), "hung": s["errors"].get("timeout", 0),
        "rss_mib_first_last_max": [rss[0][1] / 2**20, rss[-1][1] / 2**20, max(r for _, r in rss) / 2**20],
        "rss_growth_last_vs_second_fifth": growth,
        "pass": sum(s["errors"].values()) == 0 and abs(growth) < 0.10,
    }
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8000, help="Serve HTTP port on 127.0.0.1")
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--duration-s", type=float, default=300)
    ap.add_argument("--timeout-s", type=float, default=300, help="per stream; one past it counts as hung")
    args = ap.parse_args(argv)
    # the engine's own queue (max_queue 256) holds what its 16-sequence batch cannot run yet
    with serve_cpu_default({"soak": {"num_threads": 2}}, args.port, max_ongoing=args.streams + 16) as urls:
        res = asyncio.run(soak(urls["soak"], "soak", args.streams, args.duration_s, args.timeout_s))
        time.sleep(2)
        res["kv_after"] = engine_kv("soak")
    res.pop("records")  # ~thousands; the summary and samples are what the result says
    save(res, args.out)
    print({**res["verdict"], "ok": res["summary"]["ok"], "errors": res["summary"]["errors"],
           "kv_after": res["kv_after"]})
    return 0 if res["verdict"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
