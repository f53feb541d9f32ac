"""Extend attention by dequantisation: gather each request's [INT2 prefix ‖ BF16 prefix ‖ chunk] K/V into
one contiguous tensor (one Triton launch), then run torch SDPA on it, request by request.

This is what the original does for prefill (flash-attn varlen over the dequantised prefix and the
chunk).  Prefill is compute-bound: the fused kernel (extend_attention.py) unpacks every INT2 tile
once per 128 query rows and runs at ~175 TFLOP/s on the H200, while the gather moves the prefix once
(bf16: 4 KB a token at 8 KV heads × d 128) and leaves the FLOPs to a flash kernel at ~320-345.
The price is a transient buffer of (Σ prefix + chunk) × H_kv × d × 2 (K, V) elements and the lengths
on the host (handed over, or one sync), so the launcher keeps the fused kernel under CUDA-graph
capture, for decode rows and short chunks, and for buffers over its byte cap (extend_routes.py).

Token order inside a request's buffer does not matter for the prefix (every chunk query sees all of
it); the chunk comes last, in order, so SDPA's lower-right causal mask is the chunk's causal mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._attn_tiles import _dequant4, _load_rows4, _page_bases
from ._quant_tiles import _round_bf16
from ._validate import nonempty_table
from .layout import PagedKV, Segments

OUT_DTYPES = {"bf16": torch.bfloat16, "bf16_interp": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
              "ieee": torch.float32}  # bf16_interp: "bf16" under TRITON_INTERPRET (_validate.py)


@triton.jit
def _store_q(ptr, row_off, rmask, x, k: tl.constexpr, QD: tl.constexpr, OUT: tl.constexpr):
    col = tl.arange(0, QD)
    ptrs = ptr + row_off[:, None] + k * QD + col[None, :]
    if OUT == 0:  # bf16, rounded to nearest even as torch's cast (the interpreter's cast truncates)
        tl.store(ptrs, _round_bf16(x), mask=rmask[:, None])
    elif OUT == 1:
        tl.store(ptrs, x.to(tl.float16), mask=rmask[:, None])
    else:
        tl.store(ptrs, x, mask=rmask[:, None])


@triton.jit
def _gather_side(c_ptr, s_ptr, b_ptr, n_ptr, cbase, sbase, base16, basen, m2, m16, mc, out_ptr, orow, omask,
                 QD: tl.constexpr, GS: tl.constexpr, BITS: tl.constexpr, OUT: tl.constexpr):
    i0, i1, i2, i3 = _dequant4(c_ptr, s_ptr, cbase, sbase, m2, QD, GS, False, BITS)
    b0, b1, b2, b3 = _load_rows4(b_ptr, base16, m16, QD, False, "ieee")
    n0, n1, n2, n3 = _load_rows4(n_ptr, basen, mc, QD, False, "ieee")
    sel2 = m2[:, None]
    sel16 = m16[:, None]
    _store_q(out_ptr, orow, omask, tl.where(sel2, i0, tl.where(sel16, b0, n0)), 0, QD, OUT)
    _store_q(out_ptr, orow, omask, tl.where(sel2, i1, tl.where(sel16, b1, n1)), 1, QD, OUT)
    _store_q(out_ptr, orow, omask, tl.where(sel2, i2, tl.where(sel16, b2, n2)), 2, QD, OUT)
    _store_q(out_ptr, orow, omask, tl.where(sel2, i3, tl.where(sel16, b3, n3)), 3, QD, OUT)


@triton.jit
def _gather_kv_kernel(kc_ptr, ks_ptr, vc_ptr, vs_ptr, kb_ptr, vb_ptr, kn_ptr, vn_ptr, t2_ptr, l2_ptr, t16_ptr,
                      l16_ptr, qo_ptr, kvo_ptr, ok_ptr, ov_ptr, nb,
                      skcp, skct, skch, svcp, svct, svch, ssp, sst, ssh, sbp, sbt, sbh, snt, snh, st2, st16,
                      sot, soh, PAGE2: tl.constexpr, PAGE16: tl.constexpr, D: tl.constexpr, GS: tl.constexpr,
                      BT: tl.constexpr, KEY_BITS: tl.constexpr, OUT: tl.constexpr):
    QD: tl.constexpr = D // 4
    h = tl.program_id(1)
    b = tl.program_id(2)
    n2 = tl.load(l2_ptr + b)
    n16 = tl.load(l16_ptr + b)
    q0 = tl.load(qo_ptr + b)
    c = tl.load(qo_ptr + b + 1) - q0
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    # rows past the host's allotment are never written, even when the lengths handed over
    # (host_lengths) disagree with the device's: the buffer was sized from the host's
    omask = (t < n2 + n16 + c) & (t < tl.load(kvo_ptr + nb + b))
    m2 = t < n2
    m16 = (t >= n2) & (t < n2 + n16)
    mc = (t >= n2 + n16) & omask
    table2 = t2_ptr + b.to(tl.int64) * st2
    kcbase = _page_bases(table2, t, m2, PAGE2, skcp, skct, h * skch)
    vcbase = _page_bases(table2, t, m2, PAGE2, svcp, svct, h * svch)
    sbase = _page_bases(table2, t, m2, PAGE2, ssp, sst, h * ssh)
    base16 = _page_bases(t16_ptr + b.to(tl.int64) * st16, t - n2, m16, PAGE16, sbp, sbt, h * sbh)
    basen = (q0 + t - n2 - n16).to(tl.int64) * snt + h * snh
    orow = (tl.load(kvo_ptr + b) + t).to(tl.int64) * sot + h * soh
    _gather_side(kc_ptr, ks_ptr, kb_ptr, kn_ptr, kcbase, sbase, base16, basen, m2, m16, mc, ok_ptr, orow, omask,
                 QD, GS, KEY_BITS, OUT)
    _gather_side(vc_ptr, vs_ptr, vb_ptr, vn_ptr, vcbase, sbase, base16, basen, m2, m16, mc, ov_ptr, orow, omask,
                 QD, GS, 2, OUT)


def gather_extend_kv(kv: PagedKV, prefix: Segments, k_new: torch.Tensor, v_new: torch.Tensor,
                     qo_indptr: torch.Tensor, lengths: list[tuple[int, int, int]], dtype: torch.dtype,
                     block_tokens: int = 64) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(K, V) [Σ_b (n2 + n16 + C)_b, H_kv, d] of `dtype` and the row offset of each request.

    lengths[b] = (INT2 tokens, BF16 tokens, chunk rows) of request b, as the caller read them off the
    device; request b's rows are its dequantised INT2 tokens, its BF16 tokens, then its chunk."""
    geo = kv.geometry()
    offsets = [0]
    for n2, n16, c in lengths:
        offsets.append(offsets[-1] + n2 + n16 + c)
    h, d = geo.n_kv_heads, geo.head_dim
    ok = torch.empty(offsets[-1], h, d, dtype=dtype, device=kv.device)
    ov = torch.empty_like(ok)
    longest = max((sum(x) for x in lengths), default=0)
    if longest == 0:
        return ok, ov, offsets
    # [row offset of each request ‖ rows allotted to it], from the host lengths the buffer was sized by
    kvo = torch.tensor(offsets[:-1] + [sum(x) for x in lengths], dtype=torch.int64).to(kv.device, non_blocking=True)
    t2, t16 = nonempty_table(prefix.int2_page_table), nonempty_table(prefix.bf16_page_table)
    out = 0 if dtype == torch.bfloat16 else 1 if dtype == torch.float16 else 2
    grid = (triton.cdiv(longest, block_tokens), h, len(lengths))
    _gather_kv_kernel[grid](
        kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16, k_new, v_new, t2,
        prefix.int2_lens, t16, prefix.bf16_lens, qo_indptr, kvo, ok, ov, len(lengths),
        *kv.k_codes.stride()[:3], *kv.v_codes.stride()[:3], *kv.k_scales.stride()[:3], *kv.k_bf16.stride()[:3],
        k_new.stride(0), k_new.stride(1), t2.stride(0), t16.stride(0), ok.stride(0), ok.stride(1),
        PAGE2=geo.int2_page_size, PAGE16=geo.bf16_page_size, D=d, GS=geo.group_size, BT=block_tokens,
        KEY_BITS=geo.key_bits, OUT=out)
    return ok, ov, offsets


def extend_by_sdpa(q, k_new, v_new, kv, prefix, qo_indptr, lengths, dtype, scale, out) -> None:
    """out[rows of b] = SDPA(q_b, [prefix ‖ chunk]_b) with the chunk causal."""
    from torch.nn.attention.bias import causal_lower_right

    ok, ov, offsets = gather_extend_kv(kv, prefix, k_new, v_new, qo_indptr, lengths, dtype)
    lo = 0  # request b's first chunk row: the chunks lie back to back, as qo_indptr says
    for b, (n2, n16, c) in enumerate(lengths):
        if c:
            total = n2 + n16 + c
            qb = q[lo : lo + c].to(dtype).transpose(0, 1).unsqueeze(0)  # [1, Hq, C, d]
            kb, vb = (x[offsets[b] : offsets[b] + total].transpose(0, 1).unsqueeze(0) for x in (ok, ov))
            out[lo : lo + c] = _sdpa(qb, kb, vb, causal_lower_right(c, total), scale)[0].transpose(0, 1)
        lo += c


def _sdpa(q, k, v, mask, scale):
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if q.shape[1] == k.shape[1]:
        return sdpa(q, k, v, attn_mask=mask, scale=scale)
    try:
        return sdpa(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    except RuntimeError:  # a backend without GQA for lower-right masks: expand the KV heads
        g = q.shape[1] // k.shape[1]
        return sdpa(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), attn_mask=mask, scale=scale)
