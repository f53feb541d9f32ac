"""Demotion: BF16 pages (sink / recent ring, already rotated) → INT2 pages, every token, one launch.

demote_pages     one tensor (K or V) of the listed pages
demote_pages_kv  K and V of the same pages in one launch (grid axis 2 = side × token block), as a
                 ring overflow demotes both; each side keeps its own clip and bit width

Codes and scales equal quant/int2.py's bit for bit (the tiles of _quant_tiles.py, as the writes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from oscar_ray.quant.int2 import check_bits

from ._quant_tiles import _clip_rows, _quantize_pack_store
from ._validate import check_pow2, check_tensor
from .write import _check_int2_pages, _clip_args


@triton.jit
def _demote_side(src_ptr, src, dst, t, rmask, h, codes_ptr, scales_ptr, sbp, sbt, sbh, scp, sco, sch, ssp, sso, ssh,
                 D: tl.constexpr, GS: tl.constexpr, BR: tl.constexpr, CLIP: tl.constexpr, CLIP_IDX: tl.constexpr,
                 SCALE_FP16: tl.constexpr, BITS: tl.constexpr):
    ptrs = src_ptr + src * sbp + (t * sbt + h * sbh)[:, None] + tl.arange(0, D)[None, :]
    x = tl.load(ptrs, mask=rmask[:, None], other=0.0).to(tl.float32)
    if CLIP:
        x = _clip_rows(x, CLIP_IDX)
    code_rows = codes_ptr + dst * scp + t * sco + h * sch
    scale_rows = scales_ptr + dst * ssp + t * sso + h * ssh
    _quantize_pack_store(x, rmask, code_rows, scale_rows, BR, D, GS, SCALE_FP16, BITS)


@triton.jit
def _demote_pages_kernel(sk_ptr, sv_ptr, src_ids_ptr, dst_ids_ptr, kc_ptr, ks_ptr, vc_ptr, vs_ptr, page_size,
                         sbp, sbt, sbh, skp, sko, skh, svp, svo, svh, ssp, sso, ssh,
                         D: tl.constexpr, GS: tl.constexpr, BR: tl.constexpr, TB: tl.constexpr,
                         CLIP_K: tl.constexpr, CLIP_IDX_K: tl.constexpr, BITS_K: tl.constexpr,
                         CLIP_V: tl.constexpr, CLIP_IDX_V: tl.constexpr, SCALE_FP16: tl.constexpr):
    i = tl.program_id(0)
    h = tl.program_id(1)
    t = (tl.program_id(2) % TB) * BR + tl.arange(0, BR)  # token offsets inside the page
    rmask = t < page_size
    src = tl.load(src_ids_ptr + i).to(tl.int64)
    dst = tl.load(dst_ids_ptr + i).to(tl.int64)
    if tl.program_id(2) < TB:
        _demote_side(sk_ptr, src, dst, t, rmask, h, kc_ptr, ks_ptr, sbp, sbt, sbh, skp, sko, skh, ssp, sso, ssh,
                     D, GS, BR, CLIP_K, CLIP_IDX_K, SCALE_FP16, BITS_K)
    else:  # V: always 2 bits
        _demote_side(sv_ptr, src, dst, t, rmask, h, vc_ptr, vs_ptr, sbp, sbt, sbh, svp, svo, svh, ssp, sso, ssh,
                     D, GS, BR, CLIP_V, CLIP_IDX_V, SCALE_FP16, 2)


def demote_pages(bf16_pages: torch.Tensor, src_page_ids: torch.Tensor, dst_page_ids: torch.Tensor,
                 codes: torch.Tensor, scales: torch.Tensor, clip_ratio: float, group_size: int | None = None,
                 num_warps: int = 8, bits: int = 2) -> None:
    """Quantise every token of BF16 pages src_page_ids[i] into INT2 page dst_page_ids[i], one launch.

    bf16_pages [P16, page, H_kv, d] hold rotated rows, so no rotation is applied; the INT2 pages
    must have the same page size.  The source pages are left as they are (the caller frees them).
    """
    demote_pages_kv(bf16_pages, None, src_page_ids, dst_page_ids, codes, scales, None, None, clip_ratio, 0.0,
                    group_size, num_warps, key_bits=bits, _k_name="clip_ratio")


def demote_pages_kv(k_pages: torch.Tensor, v_pages: torch.Tensor | None, src_page_ids: torch.Tensor,
                    dst_page_ids: torch.Tensor, k_codes: torch.Tensor, k_scales: torch.Tensor,
                    v_codes: torch.Tensor | None, v_scales: torch.Tensor | None, k_clip: float, v_clip: float,
                    group_size: int | None = None, num_warps: int = 8, key_bits: int = 2,
                    _k_name: str = "k_clip") -> None:
    """demote_pages of K (key_bits 2 or 3) and V (2 bits) of the same pages, one launch.

    k_pages / v_pages bf16 [P16, page, H_kv, d] of one layout; V's codes and scales must have K's
    scale dtype and layout.  v_pages, v_codes, v_scales None demotes K only.
    num_warps 8: H200, one page per request, K + V: 3.1 / 3.2 / 4.7 µs at bs 1 / 8 / 32 vs 4.1 / 4.3 /
    5.1 at 4 warps and 4.3 / 4.5 / 7.1 at 16 (decode_h200.md, evening round; not profiled further).
    Example: demote_pages_kv(k_bf16, v_bf16, src, dst, kc, ks, vc, vs, 0.96, 0.0)   # a ring overflow
    """
    check_tensor("k_pages", k_pages, (torch.bfloat16,), ndim=4)
    _, page, h, d = k_pages.shape
    check_pow2("head_dim", d, minimum=16)
    key_bits = check_bits(key_bits)
    dev = k_pages.device
    gs, _ = _check_int2_pages(k_codes, k_scales, h, d, group_size, dev, key_bits)
    if k_codes.shape[1] != page:
        raise ValueError(f"codes page size {k_codes.shape[1]} must equal bf16_pages page size {page}")
    if (v_pages is None) != (v_codes is None) or (v_pages is None) != (v_scales is None):
        raise ValueError("v_pages, v_codes and v_scales: give all three or none")
    clip_k, idx_k = _clip_args(k_clip, d, _k_name)
    clip_v, idx_v = False, 0
    if v_pages is not None:
        check_tensor("v_pages", v_pages, (torch.bfloat16,), shape=k_pages.shape, device=dev)
        if v_pages.stride() != k_pages.stride():
            raise ValueError(f"v_pages strides {v_pages.stride()} must equal k_pages strides {k_pages.stride()}")
        _check_int2_pages(v_codes, v_scales, h, d, group_size, dev, 2)
        if v_scales.dtype != k_scales.dtype or v_scales.stride() != k_scales.stride():
            raise ValueError("v_scales must have k_scales' dtype and strides")
        if v_codes.shape[1] != page:
            raise ValueError(f"v_codes page size {v_codes.shape[1]} must equal bf16_pages page size {page}")
        clip_v, idx_v = _clip_args(v_clip, d, "v_clip")
    check_tensor("src_page_ids", src_page_ids, (torch.int32,), ndim=1, device=dev)
    check_tensor("dst_page_ids", dst_page_ids, (torch.int32,), shape=src_page_ids.shape, device=dev)
    if src_page_ids.numel() == 0:
        return
    br = min(triton.next_power_of_2(page), 64)  # page 8 → 8 rows per program, no tl.dot so no 16 minimum
    tb = triton.cdiv(page, br)
    vp, vc, vs = (k_pages, k_codes, k_scales) if v_pages is None else (v_pages, v_codes, v_scales)
    grid = (src_page_ids.numel(), h, tb * (1 if v_pages is None else 2))
    _demote_pages_kernel[grid](
        k_pages, vp, src_page_ids, dst_page_ids, k_codes, k_scales, vc, vs, page,
        *k_pages.stride()[:3], *k_codes.stride()[:3], *vc.stride()[:3], *k_scales.stride()[:3],
        D=d, GS=gs, BR=br, TB=tb, CLIP_K=clip_k, CLIP_IDX_K=idx_k, BITS_K=key_bits, CLIP_V=clip_v,
        CLIP_IDX_V=idx_v, SCALE_FP16=k_scales.dtype == torch.float16, num_warps=num_warps)
