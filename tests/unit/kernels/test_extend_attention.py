"""Extend attention: chunk queries over [dequantised prefix ‖ chunk] with the causal mask."""

import pytest
import torch

from oscar_ray.kernels import int2_extend_attention
from oscar_ray.kernels.reference import extend_attention_reference, rotate_heads
from oscar_ray.kernels.synthetic import random_mixed_cache
from tests.utils import assert_close_verbose

# precision → (atol, rtol); chunk rows are N(0, 1) so |o| ~ 1.  Measured max errors: ieee 3e-7,
# tf32 / fp16 6e-4, bf16 1.3e-2 (interpreter truncation; the GPU rounds to nearest)
TOLERANCES = {"ieee": (2e-6, 1e-5), "tf32": (2e-3, 1e-3), "fp16": (2e-3, 1e-3), "bf16": (3e-2, 2e-2)}


def _chunk(chunks, hq, hkv, d, dtype=torch.float32):
    n = sum(chunks)
    indptr = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    return (torch.randn(n, hq, d).to(dtype), torch.randn(n, hkv, d).to(dtype), torch.randn(n, hkv, d).to(dtype),
            indptr)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("g", [1, 3, 4])
def test_extend_batch_matches_reference(seed, d, g):
    # request 0: INT2 + BF16 prefix; 1: empty chunk; 2: no prefix (plain causal prefill); 3: C = 1
    hkv = 2
    kv, seg = random_mixed_cache([37, 5, 0, 70], [10, 0, 0, 3], hkv, d, seed=seed)
    q, k, v, indptr = _chunk([21, 0, 19, 1], hkv * g, hkv, d)
    out = int2_extend_attention(q, k, v, kv, seg, indptr, block_m=16, block_n=16, precision="ieee")
    assert_close_verbose(out, extend_attention_reference(q, k, v, kv, seg, indptr), *TOLERANCES["ieee"],
                         what=f"d={d} g={g}")


@pytest.mark.parametrize("group_size, scale_dtype", [(32, torch.float16), (None, torch.float32)])
def test_extend_single_request_rotated_bf16(seed, group_size, scale_dtype):
    # one request without qo_indptr, bf16 chunk rows, launcher-side rotations, bf16 dot precision
    d, hkv, g = 64, 2, 4
    kv, seg = random_mixed_cache([45], [16], hkv, d, group_size=group_size, scale_dtype=scale_dtype, seed=seed)
    q, k, v, indptr = _chunk([33], hkv * g, hkv, d, torch.bfloat16)
    rk = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0].float()
    rv = torch.linalg.qr(torch.randn(hkv, d, d, dtype=torch.float64))[0].float()
    out = int2_extend_attention(q, k, v, kv, seg, k_rotation=rk, v_rotation=rv, block_m=16, block_n=16)
    ref = extend_attention_reference(rotate_heads(q, rk), rotate_heads(k, rk), rotate_heads(v, rv), kv, seg, indptr)
    assert_close_verbose(out, rotate_heads(ref, rv, transpose=True), *TOLERANCES["bf16"], what="rotated bf16")


@pytest.mark.parametrize("group_size, precision", [(None, "ieee"), (32, "ieee"), (None, "bf16")])
def test_extend_three_bit_keys(seed, group_size, precision):
    d, hkv = 64, 2
    kv, seg = random_mixed_cache([37, 0, 70], [10, 0, 3], hkv, d, group_size=group_size, key_bits=3,
                                 scale_dtype=torch.float16, seed=seed)
    q, k, v, indptr = _chunk([21, 19, 1], hkv * 4, hkv, d)
    out = int2_extend_attention(q, k, v, kv, seg, indptr, block_m=16, block_n=16, precision=precision)
    assert_close_verbose(out, extend_attention_reference(q, k, v, kv, seg, indptr), *TOLERANCES[precision],
                         what=f"3-bit keys gs={group_size} {precision}")


def test_extend_block_invariance(seed):
    kv, seg = random_mixed_cache([20], [9], 1, 64, seed=seed)
    q, k, v, _ = _chunk([90], 4, 1, 64)  # 90 rows: the default block_m (128 above 64 rows) masks 38
    outs = [int2_extend_attention(q, k, v, kv, seg, block_m=bm, block_n=bn, precision="ieee")
            for bm, bn in ((16, 16), (64, 32), (None, 32))]
    for out, what in zip(outs[1:], ("64:32", "default")):
        assert_close_verbose(out, outs[0], 1e-6, 1e-5, what=f"blocks {what}")


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_extend_tensor_core_precisions(seed, precision):
    kv, seg = random_mixed_cache([37], [10], 2, 64, seed=seed)
    q, k, v, indptr = _chunk([21], 8, 2, 64)
    out = int2_extend_attention(q, k, v, kv, seg, indptr, block_m=16, block_n=16, precision=precision)
    assert_close_verbose(out, extend_attention_reference(q, k, v, kv, seg, indptr), *TOLERANCES[precision],
                         what=precision)


def test_extend_argument_errors():
    kv, seg = random_mixed_cache([8, 8], [8, 8], 2, 64)
    q, k, v, indptr = _chunk([3, 2], 4, 2, 64)
    with pytest.raises(ValueError, match="qo_indptr"):
        int2_extend_attention(q, k, v, kv, seg)
    with pytest.raises(ValueError, match="k_new"):
        int2_extend_attention(q, k[:, :1], v, kv, seg, indptr)
    with pytest.raises(ValueError, match="qo_indptr"):
        int2_extend_attention(q, k, v, kv, seg, indptr.long())
