"""Cancel storm: N requests (default 500) whose client hangs up at a random point (uniform in
[0, max_s] after sending: before admission, mid-prefill or mid-decode), then zero leaked KV pages:
the engine's used pages (prefix-cache pages excluded, they are evictable) back to the idle value,
nothing running or queued, and a normal request still served.

    python -m load_tests.faults.cancel_storm --out load_tests/results/faults/cancel_storm.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import httpx

from load_tests.client import RequestRecord, stream_request
from load_tests.metrics import summarize
from load_tests.runner import conditions
from load_tests.workloads import SLO, Workload, build_body

from .serving import engine_kv, kv_stats, save, serve_cpu_default


def cuts_of(args: argparse.Namespace) -> list[float]:
    rng = random.Random(args.seed)
    return [rng.uniform(0, args.max_s) for _ in range(args.n)]


async def storm(url: str, args: argparse.Namespace) -> list[RequestRecord]:
    w = Workload.from_dict({"name": "storm", "kind": "shared_prefix_chat", "concurrency": 1,
                            "sampling": {"max_tokens": 48, "ignore_eos": True}})
    n, concurrency, cuts = args.n, args.concurrency, cuts_of(args)
    sem = asyncio.Semaphore(concurrency)
    recs = [RequestRecord(i) for i in range(n)]
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency + 4)) as c:
        model = (await c.get(url + "/v1/models")).json()["data"][0]["id"]

        async def one(i: int) -> None:
            async with sem:
                await stream_request(c, url + "/v1/chat/completions", build_body(w, i, model), recs[i], 120, cuts[i])

        await asyncio.gather(*(one(i) for i in range(n)))
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8000, help="Serve HTTP port on 127.0.0.1")
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-s", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with serve_cpu_default({"storm": {"num_threads": 2}}, args.port, max_ongoing=64) as urls:
        url = urls["storm"]
        idle = engine_kv("storm")
        t0 = time.perf_counter()
        recs = asyncio.run(storm(url, args))
        storm_s = time.perf_counter() - t0
        after, waited = None, 0.0
        while waited < 60:  # aborts are asynchronous: allow the engine a few steps to free
            after = engine_kv("storm")
            if after["used_pages"] == idle["used_pages"] and after["running"] == 0 and after["queue_len"] == 0:
                break
            time.sleep(1)
            waited += 1
        probe = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]})
        metrics = kv_stats(url)
    s = summarize(recs, SLO())
    res = {"conditions": conditions(url, "HuggingFaceTB/SmolLM2-135M-Instruct"), "args": vars(args),
           "storm_s": storm_s, "summary": s, "kv_idle_before": idle, "kv_after": after, "settle_s": waited,
           "metrics_after": metrics, "probe_status": probe.status_code,
           "cancelled_after_first_token": sum(r.error == "cancelled" and r.ttft is not None for r in recs),
           # where the cut fell: before the ingress answered (queued / prefill: the ingress sends
           # headers after the engine's first item), after the 200 but before text, mid-decode
           "cancel_phase": {"before_response": sum(r.error == "cancelled" and r.status is None for r in recs),
                            "after_200_before_text": sum(r.error == "cancelled" and r.status == 200
                                                         and r.ttft is None for r in recs),
                            "mid_decode": sum(r.error == "cancelled" and r.ttft is not None for r in recs)},
           "records": [{"cut_s": round(c, 3), "status": r.status, "ttft_s": r.ttft, "tokens": r.output_tokens,
                        "error": r.error} for c, r in zip(cuts_of(args), recs)]}
    leaked = after["used_pages"] - idle["used_pages"]
    res["verdict"] = {"leaked_pages": leaked, "running": after["running"], "queued": after["queue_len"],
                      "errors": s["errors"], "pass": leaked == 0 and after["running"] == 0
                      and probe.status_code == 200 and not set(s["errors"]) - {"http_429"}}
    save(res, args.out)
    print(res["verdict"], {"cancelled": s["cancelled"], "completed": s["ok"], **res["cancel_phase"]})
    return 0 if res["verdict"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
