"""Prefix hit rate and TTFT: our prefix-affinity router vs Ray Serve's default (power of two choices).

    python benchmarks/prefix_routing.py --out benchmarks/results/prefix_routing.md

Workload (shared-prefix, as sglang's generated-shared-prefix dataset): `groups` system prompts of
`prefix_tokens` tokens; each request is one group's prompt + `suffix_tokens` unique tokens, groups
drawn uniformly at random, `concurrency` clients in closed loop, streamed /v1/completions over HTTP.

Engine: the scripted mock (oscar_ray.engines.mock) with prefix-dependent prefill latency, not
SmolLM2. Why: this measures routing, and 4 torch replicas of SmolLM2 on a 2-core host would spend
the TTFT budget fighting over the cores, hiding the cache effect. The mock charges
`prefill_s_per_token` for each *uncached* prompt token (0.5 ms: SmolLM2-135M's CPU prefill is
~0.4-0.6 ms/token on 2 cores) and holds an LRU of `cache_blocks` blocks per replica, smaller than
all groups together, so a router that scatters a group over every replica thrashes the caches.
Both runs use the same seed, workload, replicas and engine; only the router changes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

import httpx

PORT = 8017


def _commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def app_config(router: str, args) -> dict:
    return {
        "model_id": "mock", "tokenizer": "smollm2",
        "engine": {"kind": "mock", "config": {
            "page_size": 16, "total_pages": 4096, "max_model_len": 8192, "token_delay_s": 0.005,
            "prefill_s_per_token": args.prefill_ms_per_token / 1000, "max_running": 16,
            "cache_blocks": args.cache_blocks}},
        "replicas": {"num_replicas": args.replicas, "num_cpus": 0.25, "max_ongoing_requests": 64},
        "router": {"kind": router, "stats_period_s": 0.5},
        "ingress": {"num_cpus": 0.25},
    }


async def one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    ttft, usage = None, None
    body = {"model": "mock", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"http://127.0.0.1:{PORT}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"] and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    return ttft, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


async def workload(args) -> dict:
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(1, 50_000) for _ in range(args.prefix_tokens)] for _ in range(args.groups)]
    prompts = [prefixes[rng.randrange(args.groups)] + [rng.randrange(1, 50_000) for _ in range(args.suffix_tokens)]
               for _ in range(args.requests)]
    queue = list(enumerate(prompts))
    results: list[tuple[float, int, int]] = []

    async def client_loop(client):
        while queue:
            _, p = queue.pop(0)
            results.append(await one(client, p, args.max_tokens))

    async with httpx.AsyncClient(timeout=120) as client:
        # warm-up: one request per replica's worth, not counted
        await asyncio.gather(*(one(client, [1] * 20, 2) for _ in range(args.replicas)))
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(args.concurrency)))
        wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in results)
    prompt, cached = sum(r[1] for r in results), sum(r[2] for r in results)
    return {"hit_rate": cached / prompt, "ttft_p50": statistics.median(ttfts),
            "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))], "ttft_mean": statistics.fmean(ttfts),
            "req_per_s": len(results) / wall, "n": len(results)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=512)
    ap.add_argument("--suffix-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--cache-blocks", type=int, default=100, help="per replica; 8 groups x 32 blocks = 256")
    ap.add_argument("--prefill-ms-per-token", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/prefix_routing.md")
    args = ap.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from oscar_ray.deployments.builder import build_app

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    rows = {}
    try:
        for router in ("pow2", "prefix_affinity"):
            serve.run(build_app(app_config(router, args)), name=f"bench-{router}", route_prefix="/")
            rows[router] = asyncio.run(workload(args))
            print(router, rows[router], flush=True)
            serve.delete(f"bench-{router}")
    finally:
        serve.shutdown()
        ray.shutdown()

    names = {"pow2": "Ray Serve default (power of two choices)", "prefix_affinity": "oscar prefix affinity"}
    lines = [
        "# Prefix routing: hit rate and TTFT, scripted engine, shared-prefix workload", "",
        f"{datetime.date.today()} · commit {_commit()} · CPU host ({os.cpu_count()} cores) · "
        "`python benchmarks/prefix_routing.py`", "",
        f"{args.replicas} replicas of the mock engine (page 16 tokens, LRU of {args.cache_blocks} blocks each, "
        f"{args.prefill_ms_per_token} ms per uncached prompt token, 5 ms per output token); {args.groups} shared "
        f"prefixes of {args.prefix_tokens} tokens + {args.suffix_tokens} unique tokens; {args.requests} requests, "
        f"{args.concurrency} closed-loop clients, {args.max_tokens} output tokens, seed {args.seed}.", "",
        "| router | prefix hit rate | TTFT p50 (ms) | TTFT p90 (ms) | TTFT mean (ms) | req/s |",
        "|---|---|---|---|---|---|",
    ]
    for k, r in rows.items():
        lines.append(f"| {names[k]} | {r['hit_rate']:.3f} | {1000 * r['ttft_p50']:.1f} | {1000 * r['ttft_p90']:.1f} "
                     f"| {1000 * r['ttft_mean']:.1f} | {r['req_per_s']:.1f} |")
    lines += ["", "Hit rate = cached prompt tokens / prompt tokens (the engine's `cached_tokens`, summed over "
              "requests). The best possible is "
              f"{args.prefix_tokens // 16 * 16 / (args.prefix_tokens + args.suffix_tokens):.3f} "
              "(every full prefix block cached) less the first request of each group per replica."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
