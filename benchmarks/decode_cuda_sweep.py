"""The CUDA INT2-tier decode kernel (oscar_ray/kernels/decode_cuda.py) on the GPU: correctness, registers, times.

    PYTHONPATH=. python3 benchmarks/decode_cuda_sweep.py --out cuda.md [--configs 4:0 8:0 4:24 ...]

A config is warps:splits[:min_blocks[:shiftless[:pipe[:copies[:overlap]]]]] (splits 0: default_cuda_splits; min_blocks absent
or 0: the launcher's; shiftless 0: the shift-per-code unpack, 1: bf16 masks in place, 2 (default): and fp16
keys; pipe P >= 3: cp.async ring of P steps; copies 1: half_rows, the ring's copies read whole sectors, two lanes per
token; 2: bulk, one cp.async.bulk per page run (head-major pages only: left out of the other layouts' rows);
overlap 1 (default): the BF16 tier's launch beside the INT2 tier on a second stream, 0: in series).
--layouts picks the INT2 tier's memory order (token: the pools'; head-scales: (s, z) stored head-major; head-pages:
codes too, so one KV head's rows of a page are one 256-byte run); --ceiling adds, per ring config, the same call
with the INT2 tier's attention left out (read_only: the ring's copies and waits alone), the load path's ceiling.
Per shape it times, in one call and with CUDA graphs over cold-L2 copies (as
benchmarks/decode_attention.py): the Triton stage 1 (int2_kernel="triton", launcher defaults), each
CUDA config, and torch SDPA over a BF16 cache.  Before timing it checks the CUDA path against the
float64 reference and the Triton path at several GQA ratios, page sizes and lengths.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_attention import D, HKV, HQ, RECENT, SINK, _commit, _fmt, _cache_copies, _sdpa_decode, _table, add_page_argument, time_calls  # noqa: E402

import oscar_ray.kernels.decode_attention as dec  # noqa: E402
from oscar_ray.kernels import decode_cuda, int2_decode_attention  # noqa: E402
from oscar_ray.kernels.reference import decode_attention_reference  # noqa: E402
from oscar_ray.kernels.synthetic import random_mixed_cache  # noqa: E402


def _variant(cfg: tuple[int, ...]) -> tuple[int, int, int | None, int, int, int, int, int, int, int]:
    """warps:splits[:min_blocks[:shiftless[:pipe[:copies[:overlap[:lookahead[:kchains[:page_ahead]]]]]]]] with the
    launcher's defaults filled in."""
    warps, splits, *rest = cfg
    minb = (rest[0] if rest else 0) or None
    shiftless = rest[1] if len(rest) > 1 else 2
    pipe = rest[2] if len(rest) > 2 else decode_cuda.DEFAULT_PIPE
    copies = rest[3] if len(rest) > 3 else 0
    overlap = rest[4] if len(rest) > 4 else 1
    lookahead = rest[5] if len(rest) > 5 else 0
    kchains = rest[6] if len(rest) > 6 else 1
    page_ahead = rest[7] if len(rest) > 7 else 1
    if copies not in (0, 1, 2):
        raise ValueError(f"copies must be 0 (per lane), 1 (half_rows) or 2 (bulk), got {copies}")
    return warps, splits, minb, shiftless, pipe, copies, overlap, lookahead, kchains, page_ahead


def func_attrs(kernel, threads: int) -> str:
    lib = torch.cuda._utils._get_gpu_runtime_library()
    out = {}
    for name, code in (("regs", 4), ("local_bytes", 3), ("static_smem", 1)):
        v = ctypes.c_int()
        lib.cuFuncGetAttribute(ctypes.byref(v), code, kernel.func)
        out[name] = v.value
    v = ctypes.c_int()  # resident CTAs per SM: the copy ceiling (read_only) must match its kernel's
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(v), kernel.func, threads, ctypes.c_size_t(0))
    out["CTAs/SM"] = v.value
    return ", ".join(f"{k} {v}" for k, v in out.items())


def check(seed: int) -> list[list[str]]:
    rows = []
    cases = [(4, 8, [3001, 1, 777, 130, 0, 16, 17]), (1, 8, [900, 33]), (3, 16, [1000, 5]), (8, 8, [1500, 64]),
             (12, 64, [2000, 47]), (16, 8, [700, 1]), (4, 32, [4096, 31])]
    for g, page, lens in cases:
        hkv = 4 if g < 8 else 2
        kv, seg = random_mixed_cache(lens, [320] * len(lens), hkv, D, int2_page_size=page,
                                     scale_dtype=torch.float16, device="cuda", seed=seed)
        q = torch.randn(len(lens), hkv * g, D, device="cuda")
        ref = decode_attention_reference(q, kv, seg)
        errs = []
        for splits in (None, 1, 7):
            o = int2_decode_attention(q, kv, seg, int2_kernel="cuda", num_splits=splits)
            errs.append(float((o - ref).abs().max()))
        tri = int2_decode_attention(q, kv, seg, int2_kernel="triton")
        rows.append([str(g), str(page), str(lens), " / ".join(f"{e:.2e}" for e in errs),
                     f"{float((tri - ref).abs().max()):.2e}", f"{float(ref.abs().max()):.3f}"])
        print(rows[-1], flush=True)
    return rows


def sweep(batch: int, ctx: int, configs, args) -> list[list[str]]:
    n2 = ctx - SINK - RECENT
    nbytes = batch * (n2 * HKV * (D // 4 + 4) * 2 + (SINK + RECENT) * HKV * D * 4) + 2 * batch * HQ * D * 4
    q = torch.randn(batch, HQ, D, device="cuda")
    rows = []
    for layout in args.layouts:  # token: [page, token, head, ...] as the pools; head-*: stored [page, head, token, ...]
        kv, seg = random_mixed_cache([n2] * batch, [SINK + RECENT] * batch, HKV, D, scale_dtype=torch.float16,
                                     device="cuda", head_major_scales=layout != "token",
                                     head_major_codes=layout == "head-pages", int2_page_size=args.page,
                                     bf16_page_size=args.page)
        tag = "" if layout == "token" else f" [{layout}]"

        def run(name, **kw):
            try:
                t = time_calls(lambda n: [lambda c=c: int2_decode_attention(q, c[0], c[1], max_int2_len=n2, **kw)
                                          for c in _cache_copies(kv, seg, n)], nbytes, args)
                rows.append([str(batch), str(ctx), name + tag, _fmt(t), f"{nbytes / t[1] / 1e3:.0f}", t[1]])
            except Exception as e:  # a config that fails to compile or launch is reported, not fatal
                rows.append([str(batch), str(ctx), name + tag, f"failed: {type(e).__name__}: {e}"[:120], "",
                             float("nan")])
            print(rows[-1], flush=True)

        if not args.no_triton:
            run("triton", int2_kernel="triton")
        original = dec.int2_tier_cuda
        for warps, splits, minb, shiftless, pipe, copies, overlap, la, kc, pa in map(_variant, configs):
            if copies == 2 and layout != "head-pages":
                continue  # bulk reads a KV head's page as one run: head-major pages only
            s = splits or decode_cuda.default_cuda_splits(batch, HKV, n2, warps)
            name = (f"cuda {warps}:{s}:{minb or 'default'}:{int(shiftless)}:{pipe}:{copies}" + ("" if overlap else " serial")
                    + (" lookahead" if la else "") + (f" kchains {kc}" if kc != 1 else "")
                    + (f" page_ahead {pa}" if pa != 1 else ""))
            for read_only in (False, True) if args.ceiling and pipe and not la else (False,):
                # the refill goes by cuda_copies: int2_decode_attention passes half_rows / bulk to the tier
                # itself, which overrides a partial's (so from 70d58cb until this fix every copies 1 / 2
                # row of this sweep timed the per-lane refill)
                dec.int2_tier_cuda = partial(original, warps=warps, min_blocks=minb, shiftless=shiftless, pipe=pipe,
                                             read_only=read_only, lookahead=bool(la), kchains=kc, page_ahead=pa)
                run(name + (" copies only" if read_only else ""), int2_kernel="cuda", num_splits=s,
                    overlap_tiers=bool(overlap), cuda_copies=decode_cuda.COPIES[copies])
        dec.int2_tier_cuda = original
        del kv, seg
    kb, vb = (torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    qb = q.to(torch.bfloat16).unsqueeze(2)
    backend, sdpa = _sdpa_decode(qb, kb, vb)
    t = time_calls(lambda n: [lambda k=k, v=v: sdpa(qb, k, v)
                              for k, v in [(kb, vb)] + [(kb.clone(), vb.clone()) for _ in range(n - 1)]],
                   batch * ctx * HKV * D * 4, args)
    for r in rows:
        r.append(f"{t[1] / r[5]:.2f}×" if r[5] == r[5] else "")
        r[5] = f"{_fmt(t)} {backend}"
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=["1x16384", "8x65536", "8x131072", "32x131072"])
    p.add_argument("--configs", nargs="+", default=["4:0", "4:0:2", "8:0"])
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton stage-1 rows")
    p.add_argument("--layouts", nargs="+", choices=["token", "head-scales", "head-pages"], default=["token"],
                   help="INT2-tier memory order of the timed caches: token-major (the pools'), (s, z) head-major, "
                        "or codes and (s, z) head-major (the layout bulk needs)")
    p.add_argument("--ceiling", action="store_true",
                   help="per ring config also time the copies alone (read_only: no INT2 attention, wrong output)")
    p.add_argument("--pipe", type=int, default=None, help="set decode_cuda.DEFAULT_PIPE (the check and default configs)")
    add_page_argument(p)
    args = p.parse_args()
    args.smoke = False
    if args.pipe is not None:
        decode_cuda.DEFAULT_PIPE = args.pipe
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs]
    lines = ["# CUDA INT2-tier decode kernel sweep", "",
             f"- GPU {torch.cuda.get_device_name()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
             f"torch {torch.__version__}, commit {_commit()}", ""]
    if not args.skip_check:
        rows = check(args.seed)
        lines += [f"## max |o − reference| (fp16 scales, bf16, pipe {decode_cuda.DEFAULT_PIPE})", ""]
        lines += _table(["GQA", "page", "INT2 lens", "cuda (default / 1 / 7 splits)", "triton", "max |ref|"], rows)
    for warps, _, minb, shiftless, pipe, copies, _, la, kc, pa in map(_variant, configs):
        bulk = copies == 2
        for read_only in (False, True) if args.ceiling and pipe and not la else (False,):
            k = decode_cuda._kernel(4, 8, warps, minb, shiftless, 32 if bulk else 256, 2 if bulk else 16, pipe,
                                    copies == 1, read_only, bulk, bool(la), kc, pa)
            lines.append(f"- kernel warps {warps} min_blocks {minb or 'default'} shiftless {int(shiftless)} pipe {pipe} "
                         f"copies {copies}{' lookahead' if la else ''}{f' kchains {kc}' if kc != 1 else ''}"
                         f"{f' page_ahead {pa}' if pa != 1 else ''}"
                         f"{' copies only' if read_only else ''}: "
                         f"{func_attrs(k, 32 * warps)}")
    lines.append("")
    rows = []
    for shape in args.shapes:
        b, t = (int(x) for x in shape.split("x"))
        rows += sweep(b, t, configs, args)
    lines += _table(["batch", "context", "kernel", "µs", "GB/s", "SDPA µs", "speedup"], rows)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
