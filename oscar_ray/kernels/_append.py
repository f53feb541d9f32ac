"""The decode launch's own write of the step's new token (int2_decode_attention's append_* arguments).

In each (request, KV head), the BF16-tier split that owns the tier's last token stores the step's
new K/V row into that slot before it attends, so the launch replaces bf16_write_kv + attention (the
fused ring write of the torch engine's decode).  Two options make it the whole per-step write:
  * rotate_append: the rows come in the model's basis and are multiplied by k_rotation / v_rotation
    here, with write.py's _load_rotated_rows (the same ascending-k FMA chains as int2_write_kv /
    bf16_write_kv on the GPU, so the same bits);
  * append_int2 = (page, offset) [B]: the rows are also clipped, quantised and packed into that slot
    of the INT2 tier with the write path's _quant_tiles (bit-exact to quant/), for a cache that keeps
    every token INT2 as well (the sglang pool's dual residency), whose two int2_write_kv launches
    cost 6.9 µs per layer and step at bs 1 on the H200 (decode_h200.md, writes).  Two extra writer
    programs per (request, KV head) do that, one for K and one for V (_append_int2), beside the
    attending ones: nothing this step reads waits for them.  Done by the owning split instead, in
    series with its rotation and its attention, the same work added 15.4 / 23.4 / 28.3 µs at bs
    1 / 8 / 32 (H200, 2026-12-05), more than the two separate write launches (8.7-9.4 µs).
The row sits in lane 0 of a [16, d] tile (tl.dot's minimum extent); the other 15 rows are masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._quant_tiles import _round_bf16
from ._validate import FLOAT_ROWS, check_tensor
from .write import _clip_args, _int2_rows, _load_rotated_rows, _rotation_chunk


@triton.jit
def _append_step(b, kh, split, lens_ptr, table_ptr, s_table, kb_ptr, vb_ptr, sbp, sbt, sbh,
                 ak_ptr, av_ptr, sab, sah, rk_ptr, rv_ptr, srkh, srvh,
                 PAGE: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                 ROT_K: tl.constexpr, ROT_V: tl.constexpr, KC: tl.constexpr):
    """Split `split` of the BF16 tier of request b, KV head kh: store the new row if it owns it."""
    seq_len = tl.load(lens_ptr + b)
    # the split rule of _tier_partial
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    last = seq_len - 1
    mine = (last >= start) & (last < tl.minimum(start + split_len, seq_len))  # never when seq_len == 0
    if ROT_K or ROT_V:  # the [16, D] tile path (8 registers more than [D] vectors at 4 warps)
        if mine:
            BR: tl.constexpr = 16
            lane = tl.arange(0, BR)
            one = lane == 0
            n = tl.zeros([BR], tl.int32) + b  # row b of append_k / append_v
            xk = _load_rotated_rows(ak_ptr, rk_ptr, n, one, kh, sab, sah, srkh, D, ROT_K, KC)
            xv = _load_rotated_rows(av_ptr, rv_ptr, n, one, kh, sab, sah, srvh, D, ROT_V, KC)
            col = tl.arange(0, D)
            page = tl.load(table_ptr + b.to(tl.int64) * s_table + last // PAGE).to(tl.int64)
            dst = (page * sbp + (last % PAGE) * sbt + kh * sbh + col)[None, :] + tl.zeros([BR, 1], tl.int64)
            row0 = one[:, None] & (col[None, :] < D)
            tl.store(kb_ptr + dst, _round_bf16(xk), mask=row0)
            tl.store(vb_ptr + dst, _round_bf16(xv), mask=row0)
            tl.debug_barrier()  # bar.sync: the CTA's own stores are visible to its loads of that slot
    elif mine:  # rows already rotated: [D] vectors
        col = tl.arange(0, D)
        page = tl.load(table_ptr + b.to(tl.int64) * s_table + last // PAGE).to(tl.int64)
        dst = page * sbp + (last % PAGE) * sbt + kh * sbh + col
        src = b.to(tl.int64) * sab + kh * sah + col
        tl.store(kb_ptr + dst, _round_bf16(tl.load(ak_ptr + src).to(tl.float32)))
        tl.store(vb_ptr + dst, _round_bf16(tl.load(av_ptr + src).to(tl.float32)))
        tl.debug_barrier()


@triton.jit
def _append_int2(b, kh, which, ak_ptr, av_ptr, sab, sah, rk_ptr, rv_ptr, srkh, srvh, p2_ptr, o2_ptr,
                 kc_ptr, ks_ptr, vc_ptr, vs_ptr, skp, skt, skh, scp, sct, sch, ssp, sst, ssh,
                 D: tl.constexpr, GS: tl.constexpr, ROT_K: tl.constexpr, ROT_V: tl.constexpr, KC: tl.constexpr,
                 CLIP_K: tl.constexpr, IDX_K: tl.constexpr, CLIP_V: tl.constexpr, IDX_V: tl.constexpr,
                 SCALE_FP16: tl.constexpr, KEY_BITS: tl.constexpr):
    """One of the two writer programs of (b, kh): K (which 0) or V (1) of the new row, rotated, clipped,
    quantised and packed into its INT2 slot (write.py's _int2_rows, so int2_write_kv's bits)."""
    BR: tl.constexpr = 16
    one = tl.arange(0, BR) == 0
    n = tl.zeros([BR], tl.int32) + b
    p2 = tl.load(p2_ptr + b).to(tl.int64)
    o2 = tl.load(o2_ptr + b)
    zero = tl.zeros([BR], tl.int64)
    srow = p2 * ssp + o2 * sst + kh * ssh + zero  # K and V scales share strides
    if which == 0:
        _int2_rows(ak_ptr, rk_ptr, n, one, kh, sab, sah, srkh, kc_ptr + (p2 * skp + o2 * skt + kh * skh + zero),
                   ks_ptr + srow, D, GS, BR, ROT_K, KC, CLIP_K, IDX_K, SCALE_FP16, KEY_BITS)
    else:
        _int2_rows(av_ptr, rv_ptr, n, one, kh, sab, sah, srvh, vc_ptr + (p2 * scp + o2 * sct + kh * sch + zero),
                   vs_ptr + srow, D, GS, BR, ROT_V, KC, CLIP_V, IDX_V, SCALE_FP16, 2)


@dataclass(frozen=True)
class AppendArgs:
    """Checked append arguments as _append_step takes them (tensors, strides, constexprs)."""

    enabled: bool
    tensors: tuple  # append_k, append_v, k rotation, v rotation, INT2 page, INT2 offset
    strides: tuple  # sab, sah, srkh, srvh
    constexprs: dict


def append_args(q: torch.Tensor, b: int, hkv: int, d: int, append_k, append_v, rotate_append: bool,
                k_rotation, v_rotation, append_int2, append_clip, scale_fp16: bool) -> AppendArgs:
    """Validate int2_decode_attention's append_* arguments (ValueError naming the argument).

    k_rotation / v_rotation: as int2_decode_attention checked them (None or contiguous fp32)."""
    off = dict(ROT_K=False, ROT_V=False, KC=16, INT2W=False, CLIP_K=False, IDX_K=0, CLIP_V=False, IDX_V=0,
               SCALE_FP16=scale_fp16)
    if (append_k is None) != (append_v is None):
        raise ValueError("append_k and append_v: give both or neither")
    if append_k is None:
        if rotate_append or append_int2 is not None:
            raise ValueError("rotate_append / append_int2 need append_k and append_v")
        return AppendArgs(False, (q,) * 6, (0, 0, 0, 0), off)
    dev = q.device
    check_tensor("append_k", append_k, FLOAT_ROWS, shape=(b, hkv, d), device=dev)
    check_tensor("append_v", append_v, FLOAT_ROWS, shape=(b, hkv, d), device=dev)
    if append_k.stride() != append_v.stride() or append_k.stride(2) != 1:
        append_k, append_v = append_k.contiguous(), append_v.contiguous()
    rk = k_rotation if rotate_append else None
    rv = v_rotation if rotate_append else None
    page = offset = q
    consts = dict(off, ROT_K=rk is not None, ROT_V=rv is not None, KC=_rotation_chunk(d))
    if append_int2 is not None:
        if not (isinstance(append_int2, (tuple, list)) and len(append_int2) == 2):
            raise ValueError("append_int2 must be a (page_ids, offsets) pair of int32 [B] tensors")
        page, offset = append_int2
        check_tensor("append_int2 page_ids", page, (torch.int32,), shape=(b,), device=dev)
        check_tensor("append_int2 offsets", offset, (torch.int32,), shape=(b,), device=dev)
        k_clip, v_clip = append_clip
        clip_k, idx_k = _clip_args(k_clip, d, "append_clip[0] (K)")
        clip_v, idx_v = _clip_args(v_clip, d, "append_clip[1] (V)")
        consts.update(INT2W=True, CLIP_K=clip_k, IDX_K=idx_k, CLIP_V=clip_v, IDX_V=idx_v)
    head = lambda r: 0 if r is None or r.ndim == 2 else d * d  # noqa: E731
    return AppendArgs(True, (append_k, append_v, append_k if rk is None else rk, append_v if rv is None else rv,
                             page, offset),
                      (append_k.stride(0), append_k.stride(1), head(rk), head(rv)), consts)
