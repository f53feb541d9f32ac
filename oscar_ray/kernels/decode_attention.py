"""Split-K flash-decoding over the mixed INT2 / BF16 cache (OSCAR_SPEC §5.2).

Stage 1 (`_decode_stage1_kernel`, one launch for both tiers): a program per (request b, KV head, split)
walks its share of that tier's tokens page by page, unpacks INT2 codes in registers and applies
(s, z) to the scores and probabilities rather than to every element (_attn_tiles._int2_step), and
runs all g = Hq/Hkv query heads of the KV head in one [BLOCK_H, ·] tile (BLOCK_H = next power of
two ≥ max(g, 16), the tl.dot minimum).  Each split writes its normalised partial output and
log2-sum-exp; an empty split writes LSE −inf.  The INT2 tier fills splits [0, S), the BF16 tier
splits [S, S + S16) of the same partial buffers.
Stage 2 (`_merge._decode_merge_kernel`) merges all S + S16 splits with the usual LSE weights, which is
exact attention over the union of the tiers (softmax is permutation-invariant over keys), and with
attend_new the step's new token from its rows (see _merge.py).

Split lengths are computed per request inside the kernel from its own length, so one grid (and one
CUDA graph) serves every mix of lengths, and the host never reads the lengths (no sync).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._append import _append_int2, _append_step, append_args
from ._attn_tiles import _int2_step, _load_q4, _page_bases, _rows_step, _store4
from ._merge import _decode_merge_kernel, new_token_args
from ._validate import (FLOAT_ROWS, check_positive, check_pow2, check_precision, check_rotation, check_tensor,
                        nonempty_table)
from .decode_cuda import (COPIES, cuda_unsupported, default_copies, default_cuda_splits, int2_tier_cuda,
                          resident_ctas)
from .layout import PagedKV, Segments
from .reference import rotate_heads
from .rotate import NewRows, rotate_qk
from .side_stream import SideStream

LOG2E = 1.4426950408889634
H200_SMS = 132


@triton.jit
def _tier_partial(q_ptr, k_ptr, ks_ptr, v_ptr, vs_ptr, table_ptr, lens_ptr, mid_o_ptr, mid_lse_ptr,
                  qk_scale, sqb, sqh, s_page, s_tok, s_head, sk_page, sk_tok, sk_head, ss_page, ss_tok, ss_head,
                  s_table, n_q_heads, b, kh, split, row_split, total_splits,
                  GQA: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, GS: tl.constexpr,
                  INT2: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, KEY_BITS: tl.constexpr,
                  SKIP_LAST: tl.constexpr = False):
    """Split `split` of one tier of request b, KV head kh → partial row `row_split` of mid_o / mid_lse.
    SKIP_LAST: the tier's last token is left out (attend_new: the merge attends it from its rows)."""
    QD: tl.constexpr = D // 4
    seq_len = tl.load(lens_ptr + b)
    if SKIP_LAST:
        seq_len = tl.maximum(seq_len - 1, 0)
    # this split's tokens: an equal share of the request's tier, rounded up to whole tiles
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    hj = tl.arange(0, BLOCK_H)
    hmask = hj < GQA
    heads = kh * GQA + hj  # contiguous GQA grouping: query head kh·g + j reads KV head kh
    q0, q1, q2, q3, qsum = _load_q4(q_ptr, b * sqb + heads * sqh, hmask, qk_scale, QD, PRECISION)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    a0 = tl.zeros([BLOCK_H, QD], tl.float32)
    a1 = tl.zeros([BLOCK_H, QD], tl.float32)
    a2 = tl.zeros([BLOCK_H, QD], tl.float32)
    a3 = tl.zeros([BLOCK_H, QD], tl.float32)
    table = table_ptr + b.to(tl.int64) * s_table
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        nmask = offs < end
        base = _page_bases(table, offs, nmask, PAGE, s_page, s_tok, kh * s_head)
        if INT2:
            sbase = _page_bases(table, offs, nmask, PAGE, ss_page, ss_tok, kh * ss_head)
            if KEY_BITS == 2:
                kbase = base  # K and V code rows share strides
            else:
                kbase = _page_bases(table, offs, nmask, PAGE, sk_page, sk_tok, kh * sk_head)
            m, l, a0, a1, a2, a3 = _int2_step(q0, q1, q2, q3, qsum, k_ptr, ks_ptr, v_ptr, vs_ptr, base, kbase,
                                              sbase, nmask, m, l, a0, a1, a2, a3, QD, GS, PRECISION, KEY_BITS)
        else:
            m, l, a0, a1, a2, a3 = _rows_step(q0, q1, q2, q3, k_ptr, v_ptr, base, nmask, nmask[None, :],
                                              m, l, a0, a1, a2, a3, QD, PRECISION)

    row = (b * n_q_heads + heads).to(tl.int64) * total_splits + row_split  # [BLOCK_H]
    inv_l = tl.where(l > 0, 1.0 / tl.where(l > 0, l, 1.0), 0.0)
    _store4(mid_o_ptr, row * D, hmask, a0, a1, a2, a3, inv_l, QD)
    lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
    tl.store(mid_lse_ptr + row, lse, mask=hmask)


@triton.jit
def _decode_stage1_kernel(q_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, t2_ptr, l2_ptr, kb_ptr, vb_ptr, t16_ptr, l16_ptr,
                          mid_o_ptr, mid_lse_ptr, qk_scale, sqb, sqh, scp, sct, sch, skp, skt, skh, ssp, sst, ssh,
                          st2, sbp, sbt, sbh, st16, n_q_heads, ak_ptr, av_ptr, rk_ptr, rv_ptr, ap_ptr, ao_ptr,
                          sab, sah, srkh, srvh, split0,
                          GQA: tl.constexpr, PAGE2: tl.constexpr, PAGE16: tl.constexpr, D: tl.constexpr,
                          GS: tl.constexpr, SPLITS2: tl.constexpr, SPLITS16: tl.constexpr, BLOCK_H: tl.constexpr,
                          BLOCK_N2: tl.constexpr, BLOCK_N16: tl.constexpr, PRECISION: tl.constexpr,
                          KEY_BITS: tl.constexpr, APPEND: tl.constexpr, ROT_K: tl.constexpr, ROT_V: tl.constexpr,
                          KC: tl.constexpr, INT2W: tl.constexpr, CLIP_K: tl.constexpr, IDX_K: tl.constexpr,
                          CLIP_V: tl.constexpr, IDX_V: tl.constexpr, SCALE_FP16: tl.constexpr,
                          NEW: tl.constexpr):
    # both tiers in one launch (splits [0, SPLITS2) INT2, the rest BF16): one kernel launch fewer per
    # layer and step, ~4 µs of a 25 µs bs-1 16K step on the H200
    b = tl.program_id(0)
    kh = tl.program_id(1)
    pid = tl.program_id(2)
    # programs 0 and 1: the new row's INT2 write (K, V), off the attending programs' path.  `writer` is
    # a runtime i1 (the compiler makes a literal False a tensor), so the call below sits behind the
    # constexpr as well: without INT2W its placeholder pointers must never reach the compiler
    writer = False
    if INT2W:
        writer = pid < 2
    split = pid - 2 * INT2W + split0  # split0 = SPLITS2: the INT2 tier ran elsewhere (decode_cuda)
    total = SPLITS2 + SPLITS16
    if writer:
        if INT2W:
            _append_int2(b, kh, pid, ak_ptr, av_ptr, sab, sah, rk_ptr, rv_ptr, srkh, srvh, ap_ptr, ao_ptr,
                         kc_ptr, ks_ptr, vc_ptr, vs_ptr, skp, skt, skh, scp, sct, sch, ssp, sst, ssh,
                         D, GS, ROT_K, ROT_V, KC, CLIP_K, IDX_K, CLIP_V, IDX_V, SCALE_FP16, KEY_BITS)
    elif split < SPLITS2:
        _tier_partial(q_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, t2_ptr, l2_ptr, mid_o_ptr, mid_lse_ptr, qk_scale, sqb, sqh,
                      scp, sct, sch, skp, skt, skh, ssp, sst, ssh, st2, n_q_heads, b, kh, split, split, total,
                      GQA, PAGE2, D, GS, True, SPLITS2, BLOCK_H, BLOCK_N2, PRECISION, KEY_BITS)
    else:
        if APPEND:  # the step's new token, stored by the split owning its slot before anything reads it
            _append_step(b, kh, split - SPLITS2, l16_ptr, t16_ptr, st16, kb_ptr, vb_ptr, sbp, sbt, sbh,
                         ak_ptr, av_ptr, sab, sah, rk_ptr, rv_ptr, srkh, srvh, PAGE16, D, SPLITS16, BLOCK_N16,
                         ROT_K, ROT_V, KC)
        _tier_partial(q_ptr, kb_ptr, kb_ptr, vb_ptr, vb_ptr, t16_ptr, l16_ptr, mid_o_ptr, mid_lse_ptr, qk_scale, sqb,
                      sqh, sbp, sbt, sbh, 0, 0, 0, 0, 0, 0, st16, n_q_heads, b, kh, split - SPLITS2, split, total,
                      GQA, PAGE16, D, GS, False, SPLITS16, BLOCK_H, BLOCK_N16, PRECISION, 2, NEW)


def default_num_splits(batch: int, n_kv_heads: int, max_len: int | None = None, num_sms: int = H200_SMS,
                       block_n: int = 128) -> int:
    """INT2 splits per (request, KV head): about 8 stage-1 programs per SM (H200: 1056), at most 128.

    Measured on the H200 (benchmarks/results/decode_h200.md, sweep): the stage-1 kernel is latency
    bound at 3 resident programs per SM (150 registers a thread at BLOCK_N 128, 4 warps), so more,
    shorter splits keep more loads in flight: bs 8 × 8 KV heads at 128K ran 927 µs with 9 splits
    and 714 µs with 18.  bs 1 → 128 splits (1K tokens each at 128K), bs 8 → 17, bs 32 → 5.  With a
    length hint each split keeps ≥ 4 tiles, so a short context is not cut into mostly-merge pieces.
    """
    splits = math.ceil(8 * num_sms / max(1, batch * n_kv_heads))
    if max_len is not None:
        splits = min(splits, max(1, math.ceil(max_len / (4 * block_n))))
    return max(1, min(128, splits))


def default_block_n(batch: int, n_kv_heads: int, max_len: int | None, num_sms: int = H200_SMS) -> int:
    """INT2 tile length for the one-group layout: 64 when even 4-tile splits of 128 tokens leave the GPU
    short of work (fewer than 2 programs per SM), else 128.  H200 (decode_h200.md): bs 1 × 16K ran 19.8 µs
    at 64 (63 splits) vs 22.0 at 128 (32 splits); bs 1 × 32K 35.4 µs at 64 (127 splits) vs 28.4 at 128,
    so the bound sits between those two (256 and 512 programs); bs 1 × 128K and bs >= 8 run faster at 128."""
    if max_len is None:
        return 128
    return 64 if batch * n_kv_heads * math.ceil(max_len / (4 * 128)) < 2 * num_sms else 128


def default_bf16_splits(batch: int, n_kv_heads: int, num_sms: int = H200_SMS) -> int:
    """BF16 splits: the tier is small (64 sink + 256-263 recent tokens), ≤ 8 splits as in the original."""
    return max(1, min(8, math.ceil(num_sms / max(1, batch * n_kv_heads))))


_SIDE_STREAMS: dict[torch.device, SideStream] = {}


def _side_stream(device: torch.device) -> SideStream:
    """One side stream per device, made on the first (uncaptured, warm-up) call and reused, so
    CUDA-graph capture of later calls only records the fork and join."""
    key = torch.device(device.type, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = SideStream(key)
    return _SIDE_STREAMS[key]


def int2_decode_attention(q: torch.Tensor, kv: PagedKV, seg: Segments, *, k_rotation: torch.Tensor | None = None,
                          v_rotation: torch.Tensor | None = None, sm_scale: float | None = None,
                          num_splits: int | None = None, bf16_splits: int | None = None,
                          max_int2_len: int | None = None, block_n: int | None = None, bf16_block_n: int = 64,
                          num_warps: int = 4, num_stages: int | None = None, precision: str = "bf16",
                          num_sms: int = H200_SMS, max_registers: int | None = None,
                          append_k: torch.Tensor | None = None, append_v: torch.Tensor | None = None,
                          int2_kernel: str = "auto", rotate_append: bool = False,
                          append_int2: tuple[torch.Tensor, torch.Tensor] | None = None,
                          append_clip: tuple[float, float] = (0.0, 0.0), cuda_copies: str = "auto",
                          overlap_tiers: bool | str = "auto",
                          attend_new: tuple[torch.Tensor, torch.Tensor] | None = None,
                          store_new: tuple | None = None) -> torch.Tensor:
    """One decode query per request over its INT2 + BF16 tokens → o [B, Hq, d] float32.

    q [B, Hq, d] is in the rotated K basis unless k_rotation (fp32 [d, d] or [H_kv, d, d]) is given,
    in which case q·R_K is one Triton launch here (rotate.py).  o is in the rotated V basis unless v_rotation is
    given (then o·R_Vᵀ).  A request with no tokens in either tier gets o = 0.
    precision: the dot operands.  "bf16" (default, as the original dequantises to BF16): q, p·s and
    BF16-tier K/V rounded to 8 bits, the codes exact; "fp16": 11 bits, ~20× smaller error on the
    unit tests, but overflows beyond ±65504 (BF16-tier K/V or |q|·0.13); "tf32" (11 bits, fp32
    range, 1.7× the shared memory and 1.2× the registers at sm_90); "ieee": fp32 FMA, for checks.
    No host sync: pass num_splits (or max_int2_len) to tune; the grid does not depend on lengths.
    block_n / num_stages None: 128 / 3 for the default layout (one (s, z) group per row) at bf16 or
    fp16, the fastest on the H200 sweep (block_n 64 when max_int2_len says the work is short, see
    default_block_n); 64 / 2 otherwise, since per-element dequantisation of several
    groups, or fp32 operands, at 128 / 3 needs 279-353 KB of shared memory (the H200 has 227 KB).
    max_registers caps the INT2 stage-1 kernel's registers a thread (ptxas maxnreg), trading spills
    for resident programs; 0 lets ptxas choose; None: 128 on CUDA for that layout at block_n 128 when
    the Triton kernel serves the INT2 tier
    (4 resident programs of 4 warps per SM instead of 3 at ptxas's 150, no spills; H200 sweep:
    bs 32 × 128K 3195 -> 2722 µs, bs 8 × 128K 736 -> 720, bs 1 × 16K 22.1 -> 22.5), else ptxas.
    append_k / append_v [B, H_kv, d] (both or neither, in the cache's rotated basis): the step's new
    token of each request, stored as bf16 into that request's last BF16-tier token slot (which
    bf16_lens must already count) inside this launch and then attended, the fused form of
    bf16_write_kv + this call; a request with no BF16-tier token writes nothing there.
    rotate_append: the append rows are in the model's basis; this launch multiplies them by
    k_rotation / v_rotation first (as the write kernels do, same bits on the GPU).
    append_int2 = (page_ids, offsets) int32 [B]: also store the rows INT2 (clip by append_clip =
    (k_clip, v_clip), quantise, pack; bit-exact to int2_write_kv) into that slot of the INT2 tier, for
    a cache that keeps every token INT2 too; with rotate_append this launch is then the step's whole
    write (the sglang backend's decode: no int2_write_kv launches).  The slot must not be one this
    step reads from the INT2 tier (the new token is attended from its BF16 copy).  See _append.py.
    int2_kernel: who computes the INT2 tier's partials: "triton" (the stage-1 kernel above, every
    layout and device, the interpreter included), "cuda" (decode_cuda.py: d 128, one group, INT2
    keys, fp16 scales, bf16, GQA <= 16, page >= 8, sm_80+; ValueError naming what is missing
    otherwise), "auto" (cuda when it can, else triton).  The BF16 tier and the merge are Triton
    either way; num_splits / block_n / num_stages / max_registers then apply to the Triton tier only.
    cuda_copies: how the CUDA tier's ring is refilled: "lane" (one token per lane), "half_rows" (two
    lanes per token, whole sectors), "bulk" (one cp.async.bulk per page run: head-major pages, sm_90)
    or "auto" (decode_cuda.default_copies); ignored when the Triton kernel serves the INT2 tier.
    overlap_tiers: with the CUDA INT2 tier, True runs the BF16 tier's Triton launch (and the append's
    writer programs) on a second stream beside it, joined before the merge (the two write disjoint
    partials): it fills the SMs the INT2 tier's last wave leaves idle instead of following it;
    False: in series; "auto" (default): beside it when the INT2 tier's CTAs fit one wave
    (decode_cuda.resident_ctas).  H100, same calls: bs 1 x 16K 14.2 µs beside vs 18.0 in series,
    bs 8 x 32K 72.1 vs 75.6 (one wave); bs 8 x 128K (two waves, the tier fills the card) 241.9 vs
    237.5 and 240.2 vs 237.8.  No effect without CUDA or with the Triton INT2 tier (one launch then).
    attend_new = (k_new, v_new) [B, H_kv, d]: each request's last BF16-tier token (bf16_lens counts
    it) is attended from these rows instead of from its slot, which this launch never reads, so the
    step's write into it may run concurrently on another stream (the sglang backend's "side" form).
    k_new is in the basis q is given in (the model's when k_rotation is given: scores are
    rotation-invariant), v_new in the cache's V basis (o's before v_rotation).  A request with no
    BF16-tier token attends no new row.  Not with append_k / append_v.  See _merge.py.
    store_new = (k_new, v_new or None, page_ids, offsets) [B', H_kv, d] / int32 [B'] (needs k_rotation):
    rows in the model's basis written into BF16 slots (page_ids[i], offsets[i]) of kv.k_bf16 /
    kv.v_bf16 by the q rotation's launch, as bf16_write_kv(k_new, v_new, k_rotation, v_rotation, ...)
    writes them, bit for bit (rotate.py); the attention then reads them there like any BF16 token
    (the sglang backend's "rotate" decode form: its step's BF16 copy without a launch of its own).
    Not with append_k / append_v or attend_new.
    Example: o = int2_decode_attention(q, PagedKV(...), Segments(...), k_rotation=R_K, v_rotation=R_V)
    """
    geo = kv.geometry()
    b = seg.check(kv.device)
    check_tensor("q", q, FLOAT_ROWS, shape=(b, None, geo.head_dim), device=kv.device)
    hq, d, hkv = q.shape[1], geo.head_dim, geo.n_kv_heads
    if hq % hkv:
        raise ValueError(f"q has {hq} heads, not a multiple of the cache's {hkv} KV heads")
    precision = check_precision(precision)
    if int2_kernel not in ("auto", "triton", "cuda"):
        raise ValueError(f"int2_kernel must be 'auto', 'triton' or 'cuda', got {int2_kernel!r}")
    why_not_cuda = cuda_unsupported(q, kv, geo, precision) if int2_kernel != "triton" else "not asked"
    if int2_kernel == "cuda" and why_not_cuda:
        raise ValueError(f"int2_kernel='cuda' cannot serve this call: {why_not_cuda}")
    use_cuda = why_not_cuda is None
    if cuda_copies not in ("auto", *COPIES):
        raise ValueError(f"cuda_copies must be 'auto' or one of {COPIES}, got {cuda_copies!r}")
    fast = geo.group_size == d and precision in ("bf16", "bf16_interp", "fp16")
    if block_n is None:
        block_n = default_block_n(b, hkv, max_int2_len, num_sms) if fast else 64
    num_stages = num_stages if num_stages is not None else (3 if fast else 2)
    for name, value in (("block_n", block_n), ("bf16_block_n", bf16_block_n)):
        check_pow2(name, value, minimum=16)
    k_rotation = check_rotation("k_rotation", k_rotation, d, hkv, kv.device)
    v_rotation = check_rotation("v_rotation", v_rotation, d, hkv, kv.device)
    for name, value in (("num_splits", num_splits), ("bf16_splits", bf16_splits)):
        if value is not None:
            check_positive(name, value)
    if max_registers is None:
        # the cap was tuned for the Triton INT2 tier; a launch serving only the BF16 tier (and the
        # append's writer programs) keeps ptxas's own count
        max_registers = 128 if fast and block_n == 128 and q.is_cuda and not use_cuda else 0
    elif max_registers != 0:
        check_positive("max_registers", max_registers)
    app = append_args(q, b, hkv, d, append_k, append_v, rotate_append, k_rotation, v_rotation, append_int2,
                      append_clip, geo.scale_fp16)
    new = new_token_args(q, b, hkv, d, attend_new, app.enabled)
    if store_new is not None:
        if k_rotation is None:
            raise ValueError("store_new needs k_rotation: the q rotation's launch stores the rows")
        if app.enabled or new.enabled:
            raise ValueError("store_new: not with append_k / append_v or attend_new (one way per new token)")
        if not (isinstance(store_new, tuple) and len(store_new) == 4):
            raise ValueError("store_new must be (k_new, v_new or None, page_ids, offsets)")
    if overlap_tiers != "auto" and not isinstance(overlap_tiers, bool):  # before any launch
        raise ValueError(f"overlap_tiers must be True, False or 'auto', got {overlap_tiers!r}")
    g = hq // hkv
    if use_cuda:
        s2 = num_splits or default_cuda_splits(b, hkv, max_int2_len, num_sms=num_sms)
    else:
        s2 = num_splits or default_num_splits(b, hkv, max_int2_len, num_sms, block_n)
    s16 = bf16_splits or default_bf16_splits(b, hkv, num_sms)
    total = s2 + s16
    if k_rotation is not None:
        store = None
        if store_new is not None:
            k_new, v_new, ids, offs = store_new
            store = NewRows(k_new, v_new, v_rotation, ids, offs, kv.k_bf16, None if v_new is None else kv.v_bf16)
        q = rotate_qk(q, k_rotation, n_kv_heads=hkv, store=store)[0]  # one launch (rotate.py)
    qk_scale = (d**-0.5 if sm_scale is None else sm_scale) * LOG2E
    mid_o = torch.empty(b, hq, total, d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(b, hq, total, dtype=torch.float32, device=q.device)
    out = torch.empty(b, hq, d, dtype=torch.float32, device=q.device)
    if b == 0:
        return out
    block_h = max(16, triton.next_power_of_2(g))
    t2, t16 = nonempty_table(seg.int2_page_table), nonempty_table(seg.bf16_page_table)
    writers = 2 if app.constexprs["INT2W"] else 0

    def stage1():
        _decode_stage1_kernel[(b, hkv, (s16 if use_cuda else total) + writers)](
            q, kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, t2, seg.int2_lens, kv.k_bf16, kv.v_bf16, t16,
            seg.bf16_lens, mid_o, mid_lse, qk_scale, q.stride(0), q.stride(1), *kv.v_codes.stride()[:3],
            *kv.k_codes.stride()[:3], *kv.k_scales.stride()[:3], t2.stride(0), *kv.k_bf16.stride()[:3], t16.stride(0),
            hq, *app.tensors, *app.strides,
            s2 if use_cuda else 0, GQA=g, PAGE2=geo.int2_page_size, PAGE16=geo.bf16_page_size, D=d, GS=geo.group_size,
            SPLITS2=s2, SPLITS16=s16, BLOCK_H=block_h, BLOCK_N2=block_n, BLOCK_N16=bf16_block_n, PRECISION=precision,
            KEY_BITS=geo.key_bits, APPEND=app.enabled, NEW=new.enabled, **app.constexprs, num_warps=num_warps,
            num_stages=num_stages, **({"maxnreg": max_registers} if max_registers else {}))

    # the BF16 launch first, beside the INT2 tier: its writer programs' serial chains start earliest
    if overlap_tiers == "auto":
        overlap_tiers = b * hkv * s2 <= resident_ctas(num_sms=num_sms)
    side = _side_stream(q.device) if use_cuda and overlap_tiers and q.is_cuda else None
    if side is not None:
        side.run(stage1)
    if use_cuda:
        cap = torch.cuda.get_device_capability(q.device) if q.is_cuda else (0, 0)  # (0, 0): the CPU emulator
        copies = default_copies(kv, geo, cap) if cuda_copies == "auto" else cuda_copies
        int2_tier_cuda(q, kv, geo, seg, mid_o, mid_lse, qk_scale, s2, half_rows=copies == "half_rows",
                       bulk=copies == "bulk")
    if side is not None:
        side.join()  # the merge reads both tiers' partials
    else:
        stage1()
    _decode_merge_kernel[(b, hq)](mid_o, mid_lse, out, out.stride(0), out.stride(1), hq, total, *new.tensors,
                                  seg.bf16_lens, *new.strides, qk_scale, D=d, BLOCK_S=triton.next_power_of_2(total),
                                  GQA=g, NEW=new.enabled, num_warps=4)
    return out if v_rotation is None else rotate_heads(out, v_rotation, transpose=True)
