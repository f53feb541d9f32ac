"""Tile-size sweep of int2_decode_attention at Qwen3-8B geometry, one cache per shape, one SDPA baseline each.

    python benchmarks/decode_sweep.py --shapes 8x131072 1x16384 --configs 64:4:2 128:4:3:18 --out /tmp/sweep.md

A config is block_n:num_warps:num_stages[:num_splits[:maxnreg]] (splits 0 or absent:
default_num_splits for that block_n; maxnreg 0: ptxas chooses, absent or -1: the launcher's default).
--emit-best writes the
fastest default-split config of the first shape as benchmarks/decode_attention.py flags.  Timing as benchmarks/decode_attention.py (CUDA graphs over cold-L2 copies, median µs).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_attention import (D, HKV, HQ, RECENT, SINK, _cache_copies, _sdpa_decode,  # noqa: E402
                              add_page_argument, bench_writes, time_calls, write_header)

from oscar_ray.kernels import default_num_splits, int2_decode_attention  # noqa: E402
from oscar_ray.kernels.synthetic import random_mixed_cache  # noqa: E402


def sweep_shape(batch: int, ctx: int, configs: list[tuple[int, ...]], args) -> list[list[str]]:
    n2 = ctx - SINK - RECENT
    es = torch.finfo(args.scale_dtype).bits // 8
    nbytes = batch * (n2 * HKV * (D // 4 + 2 * es) * 2 + (SINK + RECENT) * HKV * D * 2 * 2) + 2 * batch * HQ * D * 4
    kv, seg = random_mixed_cache([n2] * batch, [SINK + RECENT] * batch, HKV, D, scale_dtype=args.scale_dtype,
                                 device="cuda", int2_page_size=args.page, bf16_page_size=args.page)
    q = torch.randn(batch, HQ, D, device="cuda")
    copies = _cache_copies(kv, seg, max(1, min(32, -(-(192 << 20) // nbytes))))
    rows = []
    for cfg in configs:
        bn, w, st = cfg[:3]
        splits = (cfg[3] if len(cfg) > 3 else 0) or default_num_splits(batch, HKV, n2, block_n=bn)
        nreg = cfg[4] if len(cfg) > 4 and cfg[4] >= 0 else None
        name = f"{bn}:{w}:{st}:{splits}:{'default' if nreg is None else nreg}"

        def make(n, bn=bn, w=w, st=st, splits=splits, nreg=nreg):
            return [lambda c=c: int2_decode_attention(q, c[0], c[1], num_splits=splits, block_n=bn, num_warps=w,
                                                      num_stages=st, precision=args.precision, max_registers=nreg)
                    for c in copies[:n]]
        try:
            t = time_calls(make, nbytes, args)
            rows.append([batch, ctx, name, t[1], nbytes / t[1] / 1e3])
        except Exception as e:  # a config that does not compile (shared memory) is reported, not fatal
            rows.append([batch, ctx, name, float("nan"), type(e).__name__])
        rows[-1].append(cfg)
        print(rows[-1], flush=True)
    del copies, kv, seg
    kb, vb = (torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    qb = q.to(torch.bfloat16).unsqueeze(2)
    backend, sdpa = _sdpa_decode(qb, kb, vb)
    sb = batch * ctx * HKV * D * 4
    kvs = [(kb, vb)] + [(kb.clone(), vb.clone()) for _ in range(max(1, min(32, -(-(192 << 20) // sb))) - 1)]
    t_sdpa = time_calls(lambda n: [lambda k=k, v=v: sdpa(qb, k, v) for k, v in kvs[:n]], sb, args)
    out = []
    for b, c, cfg, us, gbs, _ in rows:
        ratio = t_sdpa[1] / us if us == us else float("nan")
        out.append([str(b), str(c), cfg, f"{us:.1f}", gbs if isinstance(gbs, str) else f"{gbs:.0f}",
                    f"{t_sdpa[1]:.1f} {backend}", f"{ratio:.2f}×"])
    best = min((r for r in rows if r[3] == r[3] and not (len(r[5]) > 3 and r[5][3])), key=lambda r: r[3], default=None)
    return out, (best[5] if best else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["8x131072", "8x65536", "1x16384", "1x131072", "32x131072"])
    p.add_argument("--configs", nargs="+", default=["64:4:2", "128:4:2", "128:4:3"])
    p.add_argument("--scale-dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--precision", default="bf16")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--writes", type=int, nargs="*", default=[], help="also time the write kernels at these batches")
    p.add_argument("--out", default=None)
    add_page_argument(p)
    p.add_argument("--emit-best", default=None, help="file for the first shape's fastest config as flags")
    args = p.parse_args(argv)
    args.scale_dtype, args.smoke = getattr(torch, args.scale_dtype), False
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs]
    torch.manual_seed(0)
    lines = [f"sweep on {torch.cuda.get_device_name()}, scales {args.scale_dtype}, precision {args.precision}", "",
             "| batch | context | block_n:warps:stages:splits:maxnreg | µs | GB/s | SDPA µs | speedup |", "|---|---|---|---|---|---|---|"]
    for i, shape in enumerate(args.shapes):
        b, c = (int(x) for x in shape.split("x"))
        table, best = sweep_shape(b, c, configs, args)
        lines += ["| " + " | ".join(r) + " |" for r in table]
        if i == 0 and args.emit_best and best:
            flags = f"--block-n {best[0]} --num-warps {best[1]} --num-stages {best[2]}"
            if len(best) > 4:
                flags += f" --max-registers {best[4]}"
            with open(args.emit_best, "w") as f:
                f.write(flags + "\n")
    if args.writes:
        header = write_header(args.page)
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(bench_writes(b, args, "cuda")) + " |" for b in args.writes]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
