"""Stage 2 of the split-K decode (int2_decode_attention): merge the splits' partials, and the step's new token.

Each split left a normalised partial output and its log2-sum-exp; the merge weighs them by
exp2(lse − max), which is exact attention over the union of the splits (softmax is
permutation-invariant over keys).

attend_new = (k_new, v_new): the step's new token is one more "split" of one key, scored here as
q·k_new in the basis q was given in (with k_rotation, q·R_K · (k·R_K)ᵀ = q·kᵀ since R_K is
orthogonal, so the unrotated rows serve), its partial output v_new itself.  Stage 1 then leaves each
request's last BF16-tier slot unread, so the step's write into that slot (both copies, rotation and
quantisation included) can run on another stream beside the attention instead of before it: at bs 1
the BF16 write launch before the attention cost 2.4-2.6 µs of a 14 µs step on an H100 (2026-12-07,
benchmarks/append_cost.py), the dot here costs d multiply-adds per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._validate import FLOAT_ROWS, check_tensor


@triton.jit
def _decode_merge_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, sob, soh, n_q_heads, total_splits,
                         q_ptr, nk_ptr, nv_ptr, l16_ptr, sqb, sqh, snb, snh, qk_scale,
                         D: tl.constexpr, BLOCK_S: tl.constexpr, GQA: tl.constexpr, NEW: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < total_splits
    row = (b * n_q_heads + h).to(tl.int64) * total_splits + s
    lse = tl.load(mid_lse_ptr + row, mask=smask, other=float("-inf"))
    cols = tl.arange(0, D)
    top = tl.max(lse, 0)
    if NEW:  # the new token's log2-domain score; a request with no BF16-tier token has none
        qv = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + cols).to(tl.float32)
        src = b.to(tl.int64) * snb + (h // GQA) * snh + cols  # contiguous GQA grouping
        score = tl.sum(qv * tl.load(nk_ptr + src).to(tl.float32), 0) * qk_scale
        new_lse = tl.where(tl.load(l16_ptr + b) > 0, score, float("-inf"))
        top = tl.maximum(top, new_lse)
    top = tl.where(top == float("-inf"), 0.0, top)  # a request with no tokens at all
    w = tl.where(lse > float("-inf"), tl.exp2(lse - top), 0.0)  # empty splits weigh 0
    o = tl.load(mid_o_ptr + row[:, None] * D + cols[None, :], mask=smask[:, None], other=0.0)
    total = tl.sum(w, 0)
    acc = tl.sum(w[:, None] * o, 0)
    if NEW:
        w_new = tl.where(new_lse > float("-inf"), tl.exp2(new_lse - top), 0.0)
        total += w_new
        acc += w_new * tl.load(nv_ptr + src).to(tl.float32)
    tl.store(out_ptr + b * sob + h * soh + cols, acc / tl.where(total > 0, total, 1.0))


@dataclass(frozen=True)
class NewTokenArgs:
    """Checked attend_new as the merge kernel takes it."""

    enabled: bool
    tensors: tuple  # q as given, k_new, v_new
    strides: tuple  # sqb, sqh, snb, snh


def new_token_args(q: torch.Tensor, b: int, hkv: int, d: int, attend_new, appending: bool) -> NewTokenArgs:
    """Validate int2_decode_attention's attend_new (ValueError naming the argument)."""
    if attend_new is None:
        return NewTokenArgs(False, (q, q, q), (0, 0, 0, 0))
    if appending:
        raise ValueError("attend_new and append_k / append_v: give one (the append attends its row from the slot)")
    if not (isinstance(attend_new, (tuple, list)) and len(attend_new) == 2):
        raise ValueError("attend_new must be a (k_new, v_new) pair of [B, H_kv, d] tensors")
    k_new, v_new = attend_new
    check_tensor("attend_new k_new", k_new, FLOAT_ROWS, shape=(b, hkv, d), device=q.device)
    check_tensor("attend_new v_new", v_new, FLOAT_ROWS, shape=(b, hkv, d), device=q.device)
    if k_new.stride() != v_new.stride():  # one pair of strides addresses both
        k_new, v_new = k_new.contiguous(), v_new.contiguous()
    return NewTokenArgs(True, (q, k_new, v_new), (q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1)))
