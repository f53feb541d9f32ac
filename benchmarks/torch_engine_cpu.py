"""Decode throughput and TTFT of the torch engine on CPU: N concurrent chat streams on SmolLM2.

    .venv/bin/python benchmarks/torch_engine_cpu.py --streams 16 --max-tokens 128 --kv-cache oscar
Prints one markdown row (and appends it to benchmarks/results/torch_engine_cpu.md with --save):
streams, kv cache, prompt tokens, generated tokens, wall time, aggregate tokens/s, TTFT p50/max,
per-stream decode tokens/s (after the first token).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Why is the sky blue?",
             "Write a haiku about the sea.", "What does a baker do?", "Explain rain to a child.",
             "List two planets.", "What is 12 times 12?"]


async def run(args) -> dict:
    from oscar_ray.engines.base import GenerateRequest, SamplingParams
    from oscar_ray.engines.torch import build_torch_engine

    engine = build_torch_engine({"model": "smollm2", "kv_cache": args.kv_cache, "num_threads": args.threads,
                                 "max_num_seqs": max(16, args.streams), "max_model_len": 2048})
    await engine.start()
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    async def one(i):
        msgs = ({"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (stream {i})"},)
        t0 = time.perf_counter()
        first = last = None
        async for c in engine.generate(GenerateRequest(f"b{i}", sp, messages=msgs)):
            now = time.perf_counter()
            first = first or now
            last, final = now, c
        return first - t0, last - first, final.completion_tokens, final.prompt_tokens

    t = time.perf_counter()
    res = await asyncio.gather(*[one(i) for i in range(args.streams)])
    wall = time.perf_counter() - t
    await engine.shutdown()
    ttft = [r[0] for r in res]
    gen = sum(r[2] for r in res)
    per_stream = [(r[2] - 1) / r[1] for r in res if r[1] > 0]
    return {"streams": args.streams, "kv": args.kv_cache, "prompt": sum(r[3] for r in res) // args.streams,
            "generated": gen, "wall_s": wall, "tok_s": gen / wall, "ttft_p50": statistics.median(ttft),
            "ttft_max": max(ttft), "stream_tok_s": statistics.median(per_stream)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--kv-cache", choices=["oscar", "bf16"], default="oscar")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save", action="store_true")
    args = p.parse_args()
    r = asyncio.run(run(args))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    row = (f"| {r['streams']} | {r['kv']} | {r['prompt']} | {r['generated']} | {r['wall_s']:.1f} | {r['tok_s']:.1f}"
           f" | {r['ttft_p50']:.2f} | {r['ttft_max']:.2f} | {r['stream_tok_s']:.1f} | {args.threads} | {commit} |")
    print(row)
    if args.save:
        out = Path(__file__).parent / "results" / "torch_engine_cpu.md"
        if not out.exists():
            out.write_text(f"# Torch engine on CPU, SmolLM2-135M, greedy, ignore_eos ({platform.processor() or 'cpu'}, "
                           f"{os.cpu_count()} cores visible)\n\n| streams | kv cache | prompt tokens | generated | wall s"
                           " | tokens/s (all streams) | TTFT p50 s | TTFT max s | decode tokens/s per stream"
                           " | threads | commit |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
        with out.open("a") as f:
            f.write(row + "\n")


if __name__ == "__main__":
    main()
