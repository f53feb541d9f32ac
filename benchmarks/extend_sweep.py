"""Tile sweep of int2_extend_attention (one chunk over a cached prefix) against SDPA, Qwen3-8B geometry.

    python benchmarks/extend_sweep.py --contexts 8192 32768 --configs 64:32:4:2 128:64:8:3 --out /tmp/ext.md

A config is block_m:block_n:num_warps:num_stages.  Timing as benchmarks/decode_attention.py's extend
table (CUDA graphs, median of repeats × replays); each row times SDPA again in the same call.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_attention import _commit, _table, bench_extend  # noqa: E402

HEADER = ["config (block_m:block_n:warps:stages)", "context", "chunk", "ours µs", "ours TFLOP/s", "SDPA µs",
          "SDPA TFLOP/s", "speedup"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--configs", nargs="+", default=["64:32:4:2"])
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--precision", default="bf16", choices=["ieee", "tf32", "bf16", "fp16"])
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    args.smoke, args.scale_dtype, args.extend_precision = False, torch.float16, args.precision
    torch.manual_seed(0)
    rows = []
    for cfg in args.configs:
        bm, bn, w, st = (int(x) for x in cfg.split(":"))
        for ctx in args.contexts:
            try:
                r = bench_extend(ctx, args.chunk, args, "cuda", dequant=False, block_m=bm, block_n=bn, num_warps=w,
                                 num_stages=st)
            except Exception as e:  # noqa: BLE001 - a config that does not compile (shared memory) is a row
                r = [str(ctx), str(args.chunk), f"failed: {type(e).__name__}", "", "", "", ""]
            rows.append([cfg, *r])
            print(" | ".join(rows[-1]), flush=True)
    text = "\n".join([f"# extend tile sweep ({torch.cuda.get_device_name()}, commit {_commit()},"
                      f" precision {args.precision}, fp16 scales)", "", *_table(HEADER, rows), ""])
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
