"""Decode / write / extend kernel timings at Qwen3-8B geometry against torch SDPA over a BF16 KV cache.

    python benchmarks/decode_attention.py --out benchmarks/results/decode_attention_h200.md
    TRITON_INTERPRET=1 python benchmarks/decode_attention.py --smoke --out /tmp/smoke.md   # CPU check

Each measured call is captured in a CUDA graph and replayed; one graph holds `copies` calls on
distinct copies of the inputs (≥ 192 MB in all), so every call reads its cache from HBM, not from
the 50 MB L2, as a real per-layer decode step would.  Times are per call: median (p20–p80) over
repeats × replays.  GB/s counts the bytes a call must read: INT2 codes + scales + the BF16 sink and
recent tokens (64 + 256 per request) + q and o; SDPA reads its BF16 K/V + q and o.  The split-K
partials (B·Hq·splits·(d+1)·4 B, written and re-read) are overhead, not counted.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import triton

from oscar_ray.kernels import (bf16_write, bf16_write_kv, default_num_splits, demote_pages, demote_pages_kv,
                               int2_decode_attention, int2_extend_attention, int2_write, int2_write_kv)
from oscar_ray.kernels.decode_attention import default_block_n
from oscar_ray.kernels import decode_cuda
from oscar_ray.kernels.decode_cuda import cuda_unsupported, default_cuda_splits
from oscar_ray.kernels.layout import int2_zeros
from oscar_ray.kernels.synthetic import random_mixed_cache
from oscar_ray._defaults import PAGE_SIZE

HQ, HKV, D = 32, 8, 128  # Qwen3-8B attention geometry
SINK, RECENT = 64, 256  # BF16 tokens per request (OSCAR_SPEC §4)
L2_BYTES = 192 << 20  # > 3× the H200's 50 MB L2


def _layout(args) -> dict:
    """random_mixed_cache's keywords for --page-layout (head: codes and (s, z) stored head-major) and --page."""
    head = getattr(args, "page_layout", "token") == "head"
    page = getattr(args, "page", 8)
    return {"head_major_scales": head, "head_major_codes": head, "int2_page_size": page, "bf16_page_size": page}


def add_page_argument(p: argparse.ArgumentParser, default: int | None = PAGE_SIZE, note: str = "") -> None:
    """--page, the same in every decode benchmark: tokens per page of both tiers."""
    p.add_argument("--page", type=int, default=default,
                   help=f"tokens per page, both tiers (default {PAGE_SIZE}, the serving default{note}; tables"
                        " before the H200 round of 2026-12-07 used 8)")


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=10)
    return q[1], statistics.median(samples), q[7]


def time_calls(make_fns, nbytes: int, args) -> tuple[float, float, float]:
    """Per-call µs (p20, p50, p80) of fns = make_fns(copies), one call per independent input copy."""
    copies = 1 if args.smoke else max(1, min(32, math.ceil(L2_BYTES / max(nbytes, 1))))
    fns = make_fns(copies)
    if args.smoke:  # interpreter: wall clock, no graphs
        fns[0]()
        samples = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fns[0]()
            samples.append((time.perf_counter() - t0) * 1e6)
        return _percentiles(samples * 2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm up outside the capture
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(args.repeats):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.replays)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        samples += [s.elapsed_time(e) * 1e3 / len(fns) for s, e in events]
    del graph
    return _percentiles(samples)


def _fmt(t: tuple[float, float, float]) -> str:
    return f"{t[1]:.1f} ({t[0]:.1f}–{t[2]:.1f})"


def _fits(nbytes: int, device: str) -> bool:
    if device != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return nbytes < 0.8 * free


def bench_decode(batch: int, ctx: int, args, device: str) -> list[str] | None:
    n2 = ctx - SINK - RECENT
    es = torch.finfo(args.scale_dtype).bits // 8
    k_code = D * args.key_bits // 8  # 3-bit keys: one more d/8-byte plane
    ours_bytes = (batch * (n2 * HKV * (k_code + D // 4 + 4 * es) + (SINK + RECENT) * HKV * D * 2 * 2)
                  + 2 * batch * HQ * D * 4)
    sdpa_bytes = batch * ctx * HKV * D * 2 * 2 + 2 * batch * HQ * D * 2
    if not _fits(3 * (ours_bytes + sdpa_bytes), device):
        return [str(batch), str(ctx), "skipped (memory)", "", "", "", "", "", "", "", "", ""]
    kv, seg = random_mixed_cache([n2] * batch, [SINK + RECENT] * batch, HKV, D, scale_dtype=args.scale_dtype,
                                 device=device, key_bits=args.key_bits, **_layout(args))
    block_n = args.block_n or default_block_n(batch, HKV, n2)
    # the INT2 tier's launcher default: the CUDA kernel has its own split rule
    cuda = args.int2_kernel != "triton" and cuda_unsupported(
        torch.empty(1, HQ, D, device=device), kv, kv.geometry(), args.precision) is None
    splits = args.num_splits or (default_cuda_splits(batch, HKV, n2) if cuda else
                                 default_num_splits(batch, HKV, n2, block_n=block_n))
    q = torch.randn(batch, HQ, D, device=device)
    # the fused ring write (the torch engine's decode launch): the new token's K/V row, fp32 as the
    # engine's rotated rows are, stored into each request's last BF16-tier slot by the same launch
    new_k, new_v = (torch.randn(batch, HKV, D, device=device) for _ in "kv")

    # the sglang decode step's whole write inside the launch: rotate by R_K (which also rotates q, a
    # torch matmul outside the kernels, so its baseline is the plain launch with R_K), store BF16 and
    # INT2 (into unused INT2 pages), clip K 0.96
    r_k = torch.linalg.qr(torch.randn(D, D, device=device))[0].contiguous()
    int2_slot = _free_int2_slots(kv, seg, batch)

    def ours(copies, append=None):
        caches = _cache_copies(kv, seg, copies)
        extra = {}
        if append == "ring":
            extra = dict(append_k=new_k, append_v=new_v)
        elif append in ("rot", "sglang"):
            extra = dict(k_rotation=r_k)
            if append == "sglang":
                extra.update(append_k=new_k, append_v=new_v, rotate_append=True, append_int2=int2_slot,
                             append_clip=(0.96, 0.0))
        return [lambda c=c: int2_decode_attention(q, c[0], c[1], num_splits=splits, block_n=block_n,
                                                  num_warps=args.num_warps, num_stages=args.num_stages,
                                                  precision=args.precision, max_registers=args.max_registers,
                                                  int2_kernel=args.int2_kernel, cuda_copies=args.cuda_copies,
                                                  overlap_tiers=args.overlap_tiers,
                                                  bf16_splits=getattr(args, "bf16_splits", None), **extra)
                for c in caches]

    t_ours = time_calls(ours, ours_bytes, args)
    t_fused = time_calls(lambda copies: ours(copies, append="ring"), ours_bytes, args)
    sgl = ""
    if ctx == args.contexts[0]:  # the write's cost does not depend on the context
        t_rot = time_calls(lambda copies: ours(copies, append="rot"), ours_bytes, args)
        t_sgl = time_calls(lambda copies: ours(copies, append="sglang"), ours_bytes, args)
        sgl = f"{t_sgl[1] - t_rot[1]:+.1f} ({_fmt(t_sgl)} vs {_fmt(t_rot)})"
    del kv, seg
    # separate K and V tensors: one tensor for both would let V reads hit L2 right after the K reads
    kb, vb = (torch.randn(batch, HKV, ctx, D, device=device, dtype=torch.bfloat16) for _ in "kv")
    qb = q.to(torch.bfloat16).unsqueeze(2)  # [B, Hq, 1, d]
    backend, sdpa = _sdpa_decode(qb, kb, vb)

    def base(copies):
        kvs = [(kb, vb)] + [(kb.clone(), vb.clone()) for _ in range(copies - 1)]
        return [lambda k=k, v=v: sdpa(qb, k, v) for k, v in kvs]

    t_sdpa = time_calls(base, sdpa_bytes, args)
    del kb, vb
    gbs = ours_bytes / t_ours[1] / 1e3
    return [str(batch), str(ctx), _fmt(t_ours), f"{gbs:.0f}", f"{100 * gbs / args.peak_gbs:.0f}%",
            f"{splits} / {'cuda' if cuda else block_n}",
            f"{_fmt(t_sdpa)} {backend}", f"{sdpa_bytes / t_sdpa[1] / 1e3:.0f}", f"{t_sdpa[1] / t_ours[1]:.2f}×",
            _fmt(t_fused), f"{t_fused[1] - t_ours[1]:+.1f}", sgl]


def _tensors(obj):
    return [getattr(obj, f) for f in obj.__slots__ if isinstance(getattr(obj, f), torch.Tensor)]


def _cache_copies(kv, seg, n: int) -> list:
    """(kv, seg) and n - 1 deep copies of both: the inputs time_calls cycles through to miss L2."""
    return [(kv, seg)] + [(type(kv)(*[t.clone() for t in _tensors(kv)], kv.group_size, kv.key_bits),
                           type(seg)(*[t.clone() for t in _tensors(seg)])) for _ in range(n - 1)]


def _free_int2_slots(kv, seg, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, offset) [batch] int32 in INT2 pages no request's table names: where a timed step's
    INT2 copy of the new row can land without changing what the attention reads."""
    used = set(seg.int2_page_table.flatten().tolist())
    free = torch.tensor([p for p in range(kv.k_codes.shape[0]) if p not in used], dtype=torch.int32,
                        device=kv.k_codes.device)
    slot = torch.arange(batch, device=kv.k_codes.device)
    page = kv.geometry().int2_page_size
    return free[slot // page % free.numel()].contiguous(), (slot % page).to(torch.int32)


def _sdpa_decode(q, k, v):
    """The first SDPA backend that runs this shape with enable_gqa (flash, cuDNN, efficient, math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH):
        def call(q, k, v, backend=backend):
            with sdpa_kernel([backend]):
                return sdpa(q, k, v, enable_gqa=True)
        try:
            call(q, k, v)
            return backend.name.lower(), call
        except (RuntimeError, NotImplementedError, ValueError):  # backend cannot run this shape
            continue
    raise RuntimeError("no SDPA backend runs this shape")


def bench_writes(batch: int, args, device: str) -> list[str]:
    """One decode step's writes per layer: B new K and V rows into the BF16 ring, or fused into INT2,
    each as two single-tensor launches and as one K+V launch (the *_kv kernels); and the demotion of
    one page per request (two launches), which happens every `--page` steps."""
    page = args.page
    x = torch.randn(batch, HKV, D, device=device, dtype=torch.bfloat16)
    r = torch.linalg.qr(torch.randn(D, D, device=device))[0].contiguous()
    slots = torch.arange(batch, device=device, dtype=torch.int32)
    zero = torch.zeros(batch, device=device, dtype=torch.int32)
    pages, vpages = (torch.zeros(batch, page, HKV, D, device=device, dtype=torch.bfloat16) for _ in "kv")
    head = _layout(args)["head_major_codes"]
    codes, vcodes = (int2_zeros((batch, page, HKV, D // 4), torch.uint8, device, head) for _ in "kv")
    scales, vscales = (int2_zeros((batch, page, HKV, 2), args.scale_dtype, device, head) for _ in "kv")
    # `copies` calls per graph, as a decode step captured for all layers runs them back to back: one
    # call per graph replay would time the graph launch (~8-10 µs on the H200), not the kernels
    two16 = lambda n: [lambda: (bf16_write(x, r, slots, zero, pages), bf16_write(x, r, slots, zero, vpages))] * n
    one16 = lambda n: [lambda: bf16_write_kv(x, x, r, r, slots, zero, pages, vpages)] * n
    kw = {} if args.write_warps is None else {"num_warps": args.write_warps}
    two2 = lambda n: [lambda: (int2_write(x, r, 0.96, slots, zero, codes, scales, **kw),
                               int2_write(x, r, 0.0, slots, zero, vcodes, vscales, **kw))] * n
    one2 = lambda n: [lambda: int2_write_kv(x, x, r, r, 0.96, 0.0, slots, zero, codes, scales, vcodes, vscales,
                                            **kw)] * n
    one2_single = lambda n: [lambda: int2_write_kv(x, x, r, r, 0.96, 0.0, slots, zero, codes, scales, vcodes,
                                                  vscales, two_pass=False, **kw)] * n
    dem = lambda n: [lambda: (demote_pages(pages, slots, slots, codes, scales, 0.96, **kw),
                              demote_pages(vpages, slots, slots, vcodes, vscales, 0.0, **kw))] * n
    demkv = lambda n: [lambda: demote_pages_kv(pages, vpages, slots, slots, codes, scales, vcodes, vscales,
                                               0.96, 0.0, **kw)] * n
    t16, t16kv, t2, t2kv, t2f, td, tdkv = (time_calls(f, 0, args)
                                           for f in (two16, one16, two2, one2, one2_single, dem, demkv))
    return [str(batch), _fmt(t16), _fmt(t16kv), _fmt(t2), _fmt(t2kv), _fmt(t2f), _fmt(td), _fmt(tdkv),
            f"{t16kv[1] + tdkv[1] / page:.1f}", f"{tdkv[1] / page:.1f}", f"{t16kv[1] + t2kv[1]:.1f}"]


def write_header(page: int) -> list[str]:
    return ["batch", "bf16_write ×2 µs", "bf16_write_kv µs", "int2_write ×2 µs",
                "int2_write_kv µs (default: two-pass at N ≤ 64)", "int2_write_kv one-launch µs",
                "demote ×2 µs", "demote_kv µs", f"torch engine step, unfused µs (bf16_kv + demote_kv/{page})",
                f"demote_kv/{page} µs (the fused step: this + the decode table's append cost)",
                "sglang step with separate writes µs (int2_kv + bf16_kv; now inside the decode launch, decode table)"]


def time_eager(fn, args) -> tuple[float, float, float]:
    """Per-call µs (p20, p50, p80) of fn run eagerly (no graph: a call with a host sync cannot be
    captured); each sample is the mean over `replays` back-to-back calls."""
    if args.smoke:
        return time_calls(lambda copies: [fn], 0, args)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.replays):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / args.replays)
    return _percentiles(samples * 2)


def bench_extend(ctx: int, chunk: int, args, device: str, dequant: bool = True, **tiles) -> list[str]:
    """Extend of one chunk over a cached prefix vs SDPA; tiles: block_m / block_n / num_warps /
    num_stages of the fused kernel (benchmarks/extend_sweep.py, which leaves out the dequant
    route: it has no tiles), else its defaults."""
    prefix = ctx - chunk
    kv, seg = random_mixed_cache([prefix - SINK], [SINK], HKV, D, scale_dtype=args.scale_dtype, device=device,
                                 **_layout(args))
    q = torch.randn(chunk, HQ, D, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(chunk, HKV, D, device=device, dtype=torch.bfloat16) for _ in "kv")
    indptr = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    ours = lambda copies: [lambda: int2_extend_attention(q, k, v, kv, seg, indptr, max_chunk=chunk,
                                                         precision=args.extend_precision, method="fused", **tiles)]
    t_ours = time_calls(ours, 0, args)
    if dequant:
        t_deq = time_eager(lambda: int2_extend_attention(q, k, v, kv, seg, indptr, max_chunk=chunk,
                                                         precision=args.extend_precision, method="dequant"), args)
        hl = [(prefix - SINK, SINK, chunk)]  # what an engine's scheduler hands over: no host sync
        t_deq_h = time_eager(lambda: int2_extend_attention(q, k, v, kv, seg, indptr, max_chunk=chunk,
                                                           precision=args.extend_precision, method="dequant",
                                                           host_lengths=hl), args)
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    qb = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, C, d]
    kb, vb = (torch.randn(1, HKV, ctx, D, device=device, dtype=torch.bfloat16) for _ in "kv")
    mask = causal_lower_right(chunk, ctx)  # the chunk's queries are the last C positions
    call = lambda k, v: sdpa(qb, k, v, attn_mask=mask, enable_gqa=True)
    variant = "gqa"
    try:
        call(kb, vb)
    except RuntimeError:  # some versions route lower-right masks to a kernel without GQA: expand heads
        kb, vb = kb.repeat_interleave(HQ // HKV, dim=1), vb.repeat_interleave(HQ // HKV, dim=1)
        call, variant = (lambda k, v: sdpa(qb, k, v, attn_mask=mask)), "heads expanded"
        call(kb, vb)
    base = lambda copies: [lambda: call(kb, vb)]
    t_sdpa = time_calls(base, 0, args)
    flops = 4 * HQ * D * chunk * (prefix + chunk / 2)
    row = [str(ctx), str(chunk), _fmt(t_ours), f"{flops / t_ours[1] / 1e6:.0f}", f"{_fmt(t_sdpa)} {variant}",
           f"{flops / t_sdpa[1] / 1e6:.0f}", f"{t_sdpa[1] / t_ours[1]:.2f}×"]
    if dequant:
        row += [_fmt(t_deq), f"{t_sdpa[1] / t_deq[1]:.2f}×", _fmt(t_deq_h), f"{t_sdpa[1] / t_deq_h[1]:.2f}×"]
    return row


def _commit() -> str:
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="markdown file to write (also printed)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, no CUDA graphs (CPU + TRITON_INTERPRET=1)")
    p.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--extend-contexts", type=int, nargs="*", default=[8192, 32768])
    p.add_argument("--key-bits", type=int, default=2, choices=[2, 3], help="3: the cache's 3-bit key layout")
    p.add_argument("--page-layout", default="head", choices=["token", "head"],
                   help="INT2 pages' memory order (cache.page_layout, default head: stored head-major)")
    add_page_argument(p, default=None, note="; --smoke: 8, so its tiny contexts span pages")
    p.add_argument("--extend-chunk", type=int, default=2048)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scale-dtype", default="float16", choices=["float16", "float32"],
                   help="INT2 scale storage (fp16 is OscarCacheConfig's default)")
    p.add_argument("--precision", default="bf16", choices=["ieee", "tf32", "bf16", "fp16"])
    p.add_argument("--extend-precision", default="bf16", choices=["ieee", "tf32", "bf16", "fp16"])
    p.add_argument("--num-splits", type=int, default=None, help="INT2 splits (default: default_num_splits)")
    p.add_argument("--bf16-splits", type=int, default=None,
                   help="BF16-tier splits (default: default_bf16_splits: 3 at bs 8, 8 at bs 1)")
    p.add_argument("--block-n", type=int, default=None, help="INT2 tile (default: default_block_n)")
    p.add_argument("--num-warps", type=int, default=4)
    p.add_argument("--write-warps", type=int, default=None,
                   help="num_warps of the INT2 write / demote kernels (default: the launchers')")
    p.add_argument("--num-stages", type=int, default=3)
    p.add_argument("--max-registers", type=int, default=None,
                   help="ptxas maxnreg for the INT2 stage-1 kernel (0: ptxas; default: the launcher's)")
    p.add_argument("--int2-kernel", default="auto", choices=["auto", "triton", "cuda"],
                   help="who computes the INT2 tier (int2_decode_attention's int2_kernel)")
    p.add_argument("--cuda-pipe", type=int, default=None,
                   help="decode_cuda.DEFAULT_PIPE for the CUDA INT2 tier (0: register prefetch; 3-6: cp.async ring)")
    p.add_argument("--cuda-copies", default="auto", choices=["auto", "lane", "half_rows", "bulk"],
                   help="the CUDA ring's refill (int2_decode_attention's cuda_copies; bulk: --page-layout head)")
    p.add_argument("--serial-tiers", dest="overlap_tiers", action="store_const", const=False, default="auto",
                   help="the BF16 tier's launch after the CUDA INT2 tier, not beside it (overlap_tiers=False)")
    p.add_argument("--overlap-tiers", dest="overlap_tiers", action="store_const", const=True,
                   help="beside it at every shape (overlap_tiers=True; default: 'auto', one-wave launches only)")
    p.add_argument("--peak-gbs", type=float, default=4600.0, help="HBM bandwidth for the %% column (H200)")
    args = p.parse_args(argv)
    if args.cuda_pipe is not None:  # default_cuda_splits reads it too (4 resident CTAs per SM with the ring)
        decode_cuda.DEFAULT_PIPE = args.cuda_pipe
    args.scale_dtype = getattr(torch, args.scale_dtype)
    args.page = args.page or (8 if args.smoke else PAGE_SIZE)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            p.error("--smoke runs the kernels on the CPU interpreter: set TRITON_INTERPRET=1")
        args.contexts, args.batches, args.extend_contexts, args.extend_chunk = [384], [1, 2], [256], 64
        args.repeats, args.num_splits = 2, args.num_splits or 2
        device = "cpu"
    elif not torch.cuda.is_available():
        p.error("needs a CUDA device (or --smoke with TRITON_INTERPRET=1)")
    else:
        device = "cuda"
    torch.manual_seed(0)

    decode = [bench_decode(b, t, args, device) for b in args.batches for t in args.contexts]
    writes = [bench_writes(b, args, device) for b in args.batches]
    extend = [bench_extend(t, args.extend_chunk, args, device) for t in args.extend_contexts]
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (TRITON_INTERPRET=1 smoke run)"
    how = (f"wall clock, no graphs, {args.repeats} calls" if args.smoke else
           f"CUDA graphs, {args.repeats} repeats × {args.replays} replays, decode inputs cycled over"
           f" ≥ 192 MB of copies (cold L2)")
    lines = [
        "# OSCAR INT2 decode attention vs torch SDPA (BF16 KV)", "",
        f"- GPU: {gpu}; date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- torch {torch.__version__}, triton {triton.__version__}, commit {_commit()},"
        f" python {sys.version.split()[0]}",
        f"- geometry: {HQ} q heads, {HKV} KV heads, d {D}, page {args.page} (both tiers); BF16 sink {SINK} + recent {RECENT} tokens,"
        f" INT2 rest ({args.key_bits}-bit keys, {args.page_layout}-major pages); scales {str(args.scale_dtype).split('.')[-1]}; decode precision {args.precision}, INT2 tier kernel {args.int2_kernel} (CUDA pipe {decode_cuda.DEFAULT_PIPE}, copies {args.cuda_copies}, tiers overlapped: {args.overlap_tiers}),"
        f" block_n {args.block_n or 'default_block_n'}, warps {args.num_warps} (writes {args.write_warps or 'launcher default'}),"
        f" stages {args.num_stages}, BF16-tier splits {args.bf16_splits or 'default_bf16_splits'},"
        f" maxnreg {'launcher default' if args.max_registers is None else args.max_registers or 'ptxas'}",
        f"- {how}; µs per call = median (p20–p80); GB/s on bytes read (INT2 codes + scales + BF16 tokens"
        f" + q/o; SDPA: BF16 K/V + q/o); % of {args.peak_gbs / 1000:.1f} TB/s; speedup = SDPA µs / ours µs", "",
        "## Decode (one query per request, one layer)", "",
        *_table(["batch", "context", "ours µs", "ours GB/s", "% peak", "splits / block_n", "SDPA µs (backend)",
                 "SDPA GB/s", "speedup", "ours + fused append µs", "append cost µs",
                 "sglang fused write cost µs (rotate + BF16 + INT2 in the launch, vs the same launch with R_K)"],
                decode), "",
        "## Writes per decode step (one token per request, K + V, one layer)", "",
        "bf16_write = rotate + store into the BF16 ring (the torch engine's decode path); int2_write = fused"
        " rotate + clip + quantise + pack (K clip 0.96, V none; the sglang pool writes both every step);"
        " ×2 = K and V as two calls, _kv = one call for both (int2: rotation in a launch of its own, then"
        " clip + quantise + pack, for N ≤ 64 rows by default; one-launch = the fused single kernel);"
        f" demote = one {args.page}-token page per request, every {args.page} steps; the torch engine's decode now"
        " fuses the ring write into the decode launch (decode table, append columns).", "",
        *_table(write_header(args.page), writes), "",
        f"## Extend (one request, chunk of new tokens over a cached prefix; precision {args.extend_precision})", "",
        "fused = the one-kernel extend (CUDA graph); dequant = gather [prefix ‖ chunk] to the precision's"
        " dtype + SDPA (the CUDA default for chunks of ≥ 64 rows outside graphs), timed eagerly, reading the lengths back (a host"
        " sync) or given them (host_lengths, as the torch engine passes them).", "",
        *_table(["context", "chunk", "fused µs", "fused TFLOP/s", "SDPA µs", "SDPA TFLOP/s", "fused speedup",
                 "dequant (sync) µs", "speedup", "dequant (host_lengths) µs", "speedup"], extend), "",
    ]
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
