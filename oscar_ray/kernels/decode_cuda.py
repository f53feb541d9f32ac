"""INT2-tier decode partials as a hand-scheduled CUDA kernel (NVRTC), for d = 128 on sm_80+.

Why not Triton here: the Triton stage-1 loop costs ~37 warp-instructions per token-head (H200,
decode_h200.md) because Triton pads the 4 query heads of a KV head to 16 MMA rows, re-copies the
q fragments before every MMA and moves unpacked codes through shared memory to reach the dot
layouts.  Written against the mma.sync fragment layouts directly, the same math costs 17.6
(offline sm_90 SASS; H200 bs 8 x 128K: 364.5 µs vs the Triton tier's 694.8):

  S^T [16 tokens, 8 heads] = C_K [16 tok, d] · q^T     (codes as the A operand, heads padded to 8)
  O^T [d, 8 heads]        += C_V^T [d, 16 tok] · P'^T  (P' = p·s_V, transposed by movmatrix)

Each thread loads exactly the code bytes its A fragments need and unpacks them in registers
(lop3: (w & 3·4^k) | 0x43004300 = two bf16 values 128 + 4^k·c for codes k = 0..2 in place, code 3
shifted down first; the 4^k is divided out of q and of the output rows, the +128 folded into the
zero points as in _unpack.py).  The fragment columns are a fixed permutation of d, applied to q
on load and undone when O is stored:
  K, thread (g, t), k-step j = 4w + kk, slot σ ∈ {0: col 2t, 1: 2t+1, 2: 2t+8, 3: 2t+9}:
      d = 8t + 4w + (0, 2, 1, 3)[σ] + 32·kk      (byte 8t + 4w + ·, code kk of that byte)
  V, thread (g, t), d-tile i, row g (+8 when r = 1): d = 4g + 2(i & 1) + r + 32(i >> 1)
Scores use the one-group algebra of _attn_tiles._int2_step: s·(q·(c+128) − (z+128)·Σq) and
p·v = (p∘s)·(c+128) − Σ p s (z+128).  A CTA of WARPS warps takes one split; warp w takes its
32-token steps w, w + WARPS, …, with the next step's bytes in flight (in registers, or with
pipe = P in a cp.async ring of P steps in shared memory, refilled per lane or, with bulk on
head-major pages, by one cp.async.bulk per page run on an mbarrier per slot); the warps' online-softmax
states merge in shared memory into the same (mid_o, mid_lse) rows as the Triton stage 1, so the
BF16 tier and the merge stay the Triton kernels of decode_attention.py.
The source is int2_decode.cu (+ int2_primitives.cu: its PTX primitives, unpack and tile load; int2_ring.cu:
the cp.async ring's loop); only NVRTC
(torch.cuda._compile_kernel, bundled with torch's CUDA build) is needed, once per specialisation per
process.  On CPU / under TRITON_INTERPRET this path is never taken by the launcher; CI instead runs the same source, built by g++ over a lane-level
emulator of its PTX primitives, on launch_plan()'s grid and arguments (tests/unit/kernels/cuda_emu,
test_decode_cuda_emu.py), and compiles every specialisation for sm_90 (test_compile_cuda_sm90.py);
tests/gpu checks it on the hardware against the float64 reference.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ._validate import nonempty_table
from .layout import KVGeometry, PagedKV, Segments

KERNEL_NAME = "oscar_int2_decode_d128"
STEP = 32  # tokens per online-softmax step: two 16-token MMA tiles
STEP_BYTES = 2304  # a step's bytes in the cp.async ring: 32 tokens x (32 + 32 code + 4 + 4 scale bytes)
RING_BYTES = 48 * 1024  # the ring is static shared memory: warps x pipe x STEP_BYTES must fit 48 KB
# 0: next step prefetched into registers; P >= 3: cp.async ring of P steps per warp.  4 on the H200:
# 3.06x SDPA at 128K bs8 (322.6 us) against 2.6x for 0; only 1x32K is slower (27.6 vs 25.0 us)
DEFAULT_PIPE = 4

_HERE = Path(__file__).parent
# int2_decode.cu with its two parts pasted in: the PTX primitives / unpack / tile load, and the ring loop
_SOURCE = ((_HERE / "int2_decode.cu").read_text().replace("__PRIMITIVES__", (_HERE / "int2_primitives.cu").read_text())
           .replace("__RING__", (_HERE / "int2_ring.cu").read_text()))


def _min_blocks(nt: int, warps: int, pipe: int = 0) -> int:
    # register cap = 65536 / (32 · warps · min_blocks).  ptxas (sm_90, offline) wants 164 at NT 1 and
    # ~250 at NT 2 uncapped; at 4 warps, 3 CTAs (cap 170) keep NT 1 spill-free, 4 (cap 128) spill.
    # The cp.async ring needs 125 at NT 1 (V words read from the ring at their MMAs), so 4 CTAs fit;
    # 5 (cap 102) leave 96 registers and 4 bytes of spill (min_blocks=5, one STL/LDL a step: sweep it)
    if nt == 1:
        return max(1, (16 if pipe else 12) // warps)
    return max(1, 8 // warps)


def _check_ring_options(pipe: int, half_rows: bool, read_only: bool, bulk: bool, lookahead: bool = False,
                        kchains: int = 1, page_ahead: int = 1) -> None:
    if kchains not in (1, 2):
        raise ValueError(f"kchains must be 1 or 2, got {kchains!r}")
    if page_ahead not in (1, 2):
        raise ValueError(f"page_ahead must be 1 or 2, got {page_ahead!r}")
    for flag, on in (("read_only", read_only), ("bulk", bulk), ("lookahead", lookahead)):
        if on and not pipe:
            raise ValueError(f"{flag} needs the cp.async ring (pipe >= 3)")
    if bulk and half_rows:
        raise ValueError("bulk and half_rows are two mappings of the ring's copies: pick one")


def kernel_source(gqa: int, page: int, warps: int, min_blocks: int | None = None, shiftless: int = 2,
                  code_tok: int = 256, scale_tok: int = 16, pipe: int = 0, half_rows: bool = False,
                  read_only: bool = False, bulk: bool = False, lookahead: bool = False, kchains: int = 1,
                  page_ahead: int = 1) -> str:
    """CUDA source of one specialisation (GQA ratio, INT2 page size, warps per CTA, min CTAs per SM,
    the unpack (shiftless 0: a shift per code, 1: bf16 masks in place, 2: and the keys' MMAs in fp16,
    one shift per key word), the token strides of codes (bytes) and scales (elements), the ring's
    depth and copy mapping (bulk: one cp.async.bulk per page run), read_only: the ring's copies
    alone, for benchmarks' ceiling, lookahead: the ring loop issues step i + 1's scores beside step
    i's P'·V, kchains: 1 or 2 dependent MMA chains per tile for the scores, and page_ahead: the ring
    loads a refill's page ids 1 or 2 steps before its copies).  The defaults are the measured best:
    on an H100 at bs 8 x 128K (2026-12-07, decode_h200.md) lookahead was +3.6%, kchains 2 +0.2%,
    min_blocks 5 +10.4% and bulk +14.3% slower; page_ahead 2 is untimed."""
    _check_ring_options(pipe, half_rows, read_only, bulk, lookahead, kchains, page_ahead)
    nt = -(-gqa // 8)
    min_blocks = min_blocks or _min_blocks(nt, warps, pipe)
    return (_SOURCE.replace("__NT__", str(nt)).replace("__G__", str(gqa)).replace("__PAGE__", str(page))
            .replace("__WARPS__", str(warps)).replace("__MINB__", str(min_blocks))
            .replace("__SHIFTLESS__", str(int(shiftless))).replace("__C_TOK__", str(code_tok))
            .replace("__S_TOK__", str(scale_tok)).replace("__PIPE__", str(pipe))
            .replace("__STEP_BYTES__", str(STEP_BYTES)).replace("__HALF_ROWS__", str(int(half_rows)))
            .replace("__READ_ONLY__", str(int(read_only))).replace("__BULK__", str(int(bulk)))
            .replace("__LOOKAHEAD__", str(int(lookahead))).replace("__KCHAINS__", str(int(kchains)))
            .replace("__PAGE_AHEAD__", str(int(page_ahead))))


@functools.lru_cache(maxsize=None)
def _kernel(gqa: int, page: int, warps: int, min_blocks: int | None, shiftless: int = 2, code_tok: int = 256,
            scale_tok: int = 16, pipe: int = 0, half_rows: bool = False, read_only: bool = False,
            bulk: bool = False, lookahead: bool = False, kchains: int = 1, page_ahead: int = 1,
            device: int | None = None):
    # a CUfunction belongs to the context it was loaded in: one module per device
    with torch.cuda.device(torch.cuda.current_device() if device is None else device):
        return torch.cuda._compile_kernel(kernel_source(gqa, page, warps, min_blocks, shiftless, code_tok,
                                                        scale_tok, pipe, half_rows, read_only, bulk, lookahead,
                                                        kchains, page_ahead),
                                          KERNEL_NAME,
                                          nvcc_options=["-std=c++17"])


def cuda_unsupported(q: torch.Tensor, kv: PagedKV, geo: KVGeometry, precision: str) -> str | None:
    """Why the CUDA INT2-tier kernel cannot serve this call, or None when it can."""
    if not q.is_cuda:
        return "q is not on a CUDA device"
    if torch.version.cuda is None or not hasattr(torch.cuda, "_compile_kernel"):
        return "this torch has no NVRTC kernel compiler (torch.cuda._compile_kernel)"
    if torch.cuda.get_device_capability(q.device) < (8, 0):
        return "needs sm_80+ (bf16 mma.sync)"
    checks = [(geo.head_dim == 128, f"head_dim {geo.head_dim} (needs 128)"),
              (geo.group_size == geo.head_dim, "several (s, z) groups per row"),
              (geo.key_bits == 2, f"{geo.key_bits}-bit keys"),
              (geo.scale_fp16, "fp32 scales"),
              (precision == "bf16", f"precision {precision!r} (needs 'bf16')"),
              (q.shape[1] // geo.n_kv_heads <= 16, f"GQA ratio {q.shape[1] // geo.n_kv_heads} (needs <= 16)"),
              (geo.int2_page_size >= 8, f"INT2 page size {geo.int2_page_size} (needs >= 8)"),
              (kv.k_codes.stride() == kv.v_codes.stride() and kv.k_scales.stride() == kv.v_scales.stride(),
               "K and V tiers with different strides")]
    for ok, why in checks:
        if not ok:
            return why
    c, s = kv.k_codes.stride(), kv.k_scales.stride()
    aligned = (all(x % 16 == 0 for x in c[:3]) and c[3] == 1 and all(x % 2 == 0 for x in s[:3]) and s[3] == 1
               and all(t.data_ptr() % 16 == 0 for t in (kv.k_codes, kv.v_codes))
               and all(t.data_ptr() % 4 == 0 for t in (kv.k_scales, kv.v_scales)))
    if not aligned:  # the 16-byte cp.async / uint2 loads of code rows, 4-byte (s, z) loads
        return "code rows not 16-byte aligned or (s, z) pairs not 4-byte aligned"
    return None


# One wave of CTAs instead of two when each CTA then reads at most this many tokens.  H100, head-major
# pages, bs 8 (one wave = 8 splits, two = 16; 2026-12-07): 32K 71.3 vs 76.5 µs, 64K (8192 tokens a
# CTA) 130.9 vs 133.6, 128K (16384) 244.4 vs 240.2.
ONE_WAVE_MAX_TOKENS = 8192


def resident_ctas(warps: int = 4, num_sms: int = 132) -> int:
    """CTAs of the INT2-tier kernel resident on the card at once (one wave)."""
    # 4-warp CTAs per SM: 3 at the register path's 164 registers, 4 at the ring's 125 (37 KB of
    # shared memory each at pipe 4: 148 KB of 227)
    per_sm = 4 if DEFAULT_PIPE else 3
    return per_sm * num_sms * 4 // max(1, warps)


def default_cuda_splits(batch: int, n_kv_heads: int, max_len: int | None, warps: int = 4,
                        num_sms: int = 132) -> int:
    """CTAs per (request, KV head): two waves of the resident 4-warp CTAs per SM, rounded down, or one
    when a CTA then reads <= ONE_WAVE_MAX_TOKENS; when >= 512 tokens per CTA caps that, the capped count rounded down to whole waves.
    H200 sweep (decode_h200.md), bs 8 x 128K: 12 splits 365.7 µs, 18 371.4, 24 372.7, 32 404.0,
    9 445.0 (1.45 waves: a ragged tail); bs 32 x 128K: 3 splits 1466.1, 6 1491.6, 8 1571.4;
    bs 1 x 16K: 32 (the cap) 19.6, 128 26.2, 8 38.6; bs 1 x 32K at the cap, 64 splits = 1.3 waves:
    30.5 µs (the Triton tier: 26.8), hence the rounding to 49 (one wave; not re-timed yet)."""
    units = max(1, batch * n_kv_heads)
    slots = resident_ctas(warps, num_sms)
    splits = 2 * slots // units
    if max_len is not None and slots >= units and max_len / (slots // units) <= ONE_WAVE_MAX_TOKENS:
        splits = slots // units  # one wave: no second wave's prologue, epilogue and ragged tail
    if max_len is not None:
        cap = max(1, math.ceil(max_len / (4 * STEP * warps)))
        if cap < splits:
            waves = units * cap // slots
            splits = waves * slots // units if waves >= 1 else cap
    return max(1, min(256, splits))


@dataclass(frozen=True)
class CudaLaunch:
    """One launch of the kernel: its specialisation (kernel_source's arguments), grid, block and
    arguments in the kernel's order (tensors, then qk_scale, then the int32 strides and counts)."""

    source_args: tuple  # kernel_source's arguments, positional (min_blocks, ..., lookahead, kchains, page_ahead)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    tensors: tuple  # q, k codes, k scales, v codes, v scales, table, lens, mid_o, mid_lse
    qk_scale: float
    ints: tuple  # sqb, sqh, c_page, c_head, s_page, s_head, s_table, n_q_heads, total_splits, n_splits


def _check_bulk(kv: PagedKV, page: int) -> None:
    # a run is a page (<= 32 tokens) or a 32-token part of one; cp.async.bulk moves 16-byte multiples
    # between 16-byte aligned addresses: d/4 = 32 code bytes and 4 (s, z) bytes a token, runs of >= 8
    c, s = kv.k_codes.stride(), kv.k_scales.stride()
    if c[1] != 32 or s[1] != 2:
        raise ValueError(f"bulk needs head-major pages (token strides 32 code bytes / 2 scale elements), "
                         f"got {c[1]} / {s[1]}")
    if not (32 % page == 0 if page <= 32 else page % 32 == 0):
        raise ValueError(f"bulk needs a page size dividing 32 or a multiple of 32, got {page}")
    one = kv.k_codes.shape[2] == 1  # a size-1 head dimension's stride is never used
    if (s[0] % 8 or c[0] % 16 or not one and (s[2] % 8 or c[2] % 16)
            or any(t.data_ptr() % 16 for t in (kv.k_codes, kv.v_codes, kv.k_scales, kv.v_scales))):
        raise ValueError("bulk needs 16-byte aligned page and head strides and tensors")


# The ring's copy mapping when a caller leaves it to the launcher (int2_decode_attention's
# cuda_copies="auto"): "lane" (one token per lane; runs on sm_80), "half_rows" or "bulk" on head-major
# pages.  The H100 A/B of 2026-12-07 that showed them equal timed lane in all rows (a harness bug,
# decode_h200.md), so the choice waits for a valid A/B.  Token-major pages always get "lane" (bulk needs
# a KV head's rows contiguous).
HEAD_MAJOR_COPIES = "lane"
COPIES = ("lane", "half_rows", "bulk")


def default_copies(kv: PagedKV, geo: KVGeometry, capability: tuple[int, int]) -> str:
    """The copy mapping "auto" picks for this cache on a device of this compute capability."""
    c, s = kv.k_codes.stride(), kv.k_scales.stride()
    if not (c[1] == 32 and s[1] == 2) or HEAD_MAJOR_COPIES == "lane":
        return "lane"
    if HEAD_MAJOR_COPIES == "bulk":
        if capability < (9, 0):
            return "lane"
        try:
            _check_bulk(kv, geo.int2_page_size)
        except ValueError:
            return "lane"
    return HEAD_MAJOR_COPIES


def launch_plan(q: torch.Tensor, kv: PagedKV, geo: KVGeometry, seg: Segments, mid_o: torch.Tensor,
                mid_lse: torch.Tensor, qk_scale: float, n_splits: int, warps: int = 4, min_blocks: int | None = None,
                shiftless: int = 2, pipe: int | None = None, half_rows: bool = False,
                read_only: bool = False, bulk: bool = False, lookahead: bool = False, kchains: int = 1,
                page_ahead: int = 1) -> CudaLaunch:
    """What int2_tier_cuda launches (device-independent: the CPU emulator of tests/unit/kernels runs
    the same plan); raises the ValueErrors int2_tier_cuda documents.  read_only (benchmarks only):
    the ring's copies without the attention; mid_o gets one checksum word per warp, not partials.
    bulk (sm_90): the ring refilled by one cp.async.bulk per page run, for head-major codes and (s, z)
    (a KV head's rows of a page contiguous) and pages of 8-32 tokens or multiples of 32."""
    b, hq, d = q.shape
    gqa = hq // geo.n_kv_heads
    if q.dtype != torch.float32 or q.stride(2) != 1:
        q = q.float().contiguous()
    table = nonempty_table(seg.int2_page_table)
    total = mid_o.shape[2]
    if not (mid_o.is_contiguous() and mid_lse.is_contiguous() and n_splits <= total):
        raise ValueError("mid_o / mid_lse must be contiguous with at least n_splits rows per head")
    if warps not in (1, 2, 4, 8):
        raise ValueError(f"warps must be 1, 2, 4 or 8, got {warps}")
    if shiftless not in (0, 1, 2):  # 0: a shift per code; 1: bf16 masks in place; 2: + fp16 keys (1 shift per word)
        raise ValueError(f"shiftless must be 0, 1 or 2, got {shiftless!r}")
    shiftless = int(shiftless)
    c, s = kv.k_codes.stride(), kv.k_scales.stride()
    if pipe is None:  # the default ring where it fits in 48 KB (8 warps x 4 steps need 72 KB): else registers
        pipe = DEFAULT_PIPE if warps * DEFAULT_PIPE * STEP_BYTES <= RING_BYTES else 0
    if pipe not in (0, 3, 4, 5, 6) or warps * pipe * STEP_BYTES > RING_BYTES:
        raise ValueError(f"pipe must be 0 or 3-6 steps with warps x pipe x {STEP_BYTES} B <= 48 KB of static "
                         f"shared memory, got pipe {pipe} at {warps} warps")
    _check_ring_options(pipe, half_rows, read_only, bulk, lookahead, kchains, page_ahead)
    if bulk:
        _check_bulk(kv, geo.int2_page_size)
    ints = (q.stride(0), q.stride(1), c[0], c[2], s[0], s[2], table.stride(0), hq, total, n_splits)
    if max(ints) >= 2**31:  # the kernel's stride / count parameters are 32-bit (offsets are 64-bit)
        raise ValueError(f"a stride or count does not fit the CUDA kernel's int32 parameters: {ints}")
    return CudaLaunch((gqa, geo.int2_page_size, warps, min_blocks, shiftless, c[1], s[1], pipe, bool(half_rows),
                       bool(read_only), bool(bulk), bool(lookahead), int(kchains), int(page_ahead)),
                      (b, geo.n_kv_heads, n_splits), (32 * warps, 1, 1),
                      (q, kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, table, seg.int2_lens, mid_o, mid_lse),
                      float(qk_scale), ints)


def int2_tier_cuda(q: torch.Tensor, kv: PagedKV, geo: KVGeometry, seg: Segments, mid_o: torch.Tensor,
                   mid_lse: torch.Tensor, qk_scale: float, n_splits: int, warps: int = 4, min_blocks: int | None = None,
                   shiftless: int = 2, pipe: int | None = None, half_rows: bool = False,
                   read_only: bool = False, bulk: bool = False, lookahead: bool = False, kchains: int = 1,
                   page_ahead: int = 1) -> None:
    """Partials of the INT2 tier into rows [0, n_splits) of mid_o [B, Hq, total, 128] / mid_lse.

    q [B, Hq, 128] in the rotated K basis (any float dtype; read as fp32); geo = kv.geometry(), as
    the caller validated it (not re-read per layer and step).  Callers check cuda_unsupported()
    first; this launcher checks only what the kernel would silently misread.
    """
    if bulk and torch.cuda.get_device_capability(q.device) < (9, 0):
        raise ValueError("bulk needs sm_90+ (cp.async.bulk and mbarrier tx counts)")
    plan = launch_plan(q, kv, geo, seg, mid_o, mid_lse, qk_scale, n_splits, warps, min_blocks, shiftless, pipe,
                       half_rows, read_only, bulk, lookahead, kchains, page_ahead)
    kernel = _kernel(*plan.source_args, q.device.index)
    kernel(grid=plan.grid, block=plan.block, args=[*plan.tensors, plan.qk_scale, *plan.ints],
           stream=torch.cuda.current_stream(q.device))
