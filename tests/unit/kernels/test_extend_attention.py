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


@pytest.mark.parametrize("key_bits, group_size", [(2, None), (3, 32), (2, 32)])
@pytest.mark.parametrize("precision", ["ieee", "bf16"])
def test_extend_dequant_method_matches_reference(seed, key_bits, group_size, precision):
    # method "dequant" (gather + SDPA, the CUDA default) on the same batch shapes as the fused test:
    # a prefix of both tiers, an empty chunk, no prefix, C = 1; GQA 3; rotations applied
    hkv, d = 2, 64
    kv, seg = random_mixed_cache([37, 5, 0, 70], [10, 0, 0, 3], hkv, d, group_size=group_size, key_bits=key_bits,
                                 seed=seed)
    q, k, v, indptr = _chunk([21, 0, 19, 1], 3 * hkv, hkv, d)
    rk, rv = (torch.linalg.qr(torch.randn(hkv, d, d, dtype=torch.float64))[0].float() for _ in "kv")
    out = int2_extend_attention(q, k, v, kv, seg, indptr, k_rotation=rk, v_rotation=rv, precision=precision,
                                method="dequant")
    ref = extend_attention_reference(rotate_heads(q, rk), rotate_heads(k, rk), rotate_heads(v, rv), kv, seg, indptr)
    atol, rtol = (2e-6, 1e-5) if precision == "ieee" else (3e-2, 2e-2)
    assert_close_verbose(out, rotate_heads(ref.float(), rv, transpose=True), atol, rtol,
                         what=f"dequant {precision} bits {key_bits}")
    fused = int2_extend_attention(q, k, v, kv, seg, indptr, k_rotation=rk, v_rotation=rv, block_m=16, block_n=16,
                                  precision=precision, method="fused")
    assert_close_verbose(out, fused, 2 * atol, 2 * rtol, what="dequant vs fused")


@pytest.mark.parametrize("key_bits", [2, 3])
def test_extend_on_head_major_pages(seed, key_bits):
    # INT2 pages stored head-major (cache.page_layout head): both extend methods read them by strides
    hkv, d = 2, 64
    kv, seg = random_mixed_cache([37, 5, 0, 70], [10, 0, 0, 3], hkv, d, key_bits=key_bits, seed=seed,
                                 head_major_scales=True, head_major_codes=True)
    assert kv.k_codes.stride(1) == kv.k_codes.shape[-1] and kv.k_scales.stride(1) == 2
    q, k, v, indptr = _chunk([21, 0, 19, 1], 3 * hkv, hkv, d)
    ref = extend_attention_reference(q, k, v, kv, seg, indptr)
    for method in ("fused", "dequant"):
        out = int2_extend_attention(q, k, v, kv, seg, indptr, block_m=16, block_n=16, precision="ieee", method=method)
        assert_close_verbose(out, ref, *TOLERANCES["ieee"], what=f"{method} bits {key_bits}")


def test_extend_gather_rows_bit_exact(seed):
    # the gathered K/V rows equal the reference dequantisation (fp32) and the bf16 tiers / chunk as stored
    from oscar_ray.kernels.extend_dequant import gather_extend_kv
    from oscar_ray.kernels.reference import request_kv

    kv, seg = random_mixed_cache([19, 0, 9], [5, 7, 0], 2, 64, key_bits=3, seed=seed)
    _, k, v, indptr = _chunk([4, 2, 0], 2, 2, 64)
    lengths = [(19, 5, 4), (0, 7, 2), (9, 0, 0)]
    ok, ov, offsets = gather_extend_kv(kv, seg, k, v, indptr, lengths, torch.float32)
    assert offsets == [0, 28, 37, 46] and ok.shape == (46, 2, 64)
    for b, (n2, n16, c) in enumerate(lengths):
        rk, rv = request_kv(kv, seg, b)
        lo = int(indptr[b])
        want_k, want_v = torch.cat([rk, k[lo : lo + c]]), torch.cat([rv, v[lo : lo + c]])
        assert torch.equal(ok[offsets[b] : offsets[b + 1]], want_k), f"request {b} K"
        assert torch.equal(ov[offsets[b] : offsets[b + 1]], want_v), f"request {b} V"
    ob, _, _ = gather_extend_kv(kv, seg, k, v, indptr, lengths, torch.bfloat16)
    assert torch.equal(ob, ok.to(torch.bfloat16))  # rounded to nearest even, as torch rounds


def test_extend_method_error():
    kv, seg = random_mixed_cache([8], [8], 2, 64)
    q, k, v, _ = _chunk([3], 4, 2, 64)
    with pytest.raises(ValueError, match="method"):
        int2_extend_attention(q, k, v, kv, seg, method="flash")


def test_extend_dequant_host_lengths(seed):
    # lengths handed over from the caller's scheduler give the same result as the ones read back
    kv, seg = random_mixed_cache([37, 0, 12], [10, 4, 0], 2, 64, seed=seed)
    q, k, v, indptr = _chunk([5, 3, 0], 4, 2, 64)
    read = int2_extend_attention(q, k, v, kv, seg, indptr, precision="ieee", method="dequant")
    given = int2_extend_attention(q, k, v, kv, seg, indptr, precision="ieee", method="dequant",
                                  host_lengths=[(37, 10, 5), (0, 4, 3), (12, 0, 0)])
    assert torch.equal(read, given)
    with pytest.raises(ValueError, match="host_lengths"):
        int2_extend_attention(q, k, v, kv, seg, indptr, method="dequant", host_lengths=[(37, 10, 5)])


def test_route_split_rules():
    from oscar_ray.kernels.extend_routes import (DEQUANT_MAX_BYTES, DEQUANT_MAX_REQUESTS, DEQUANT_MIN_CHUNK,
                                                 split_requests)

    row = 8 * 128 * 2  # 8 KV heads × d 128, bf16
    batch = [(6080, 64, 2048), (8000, 320, 1), (0, 0, 0), (10, 5, DEQUANT_MIN_CHUNK - 1), (0, 0, DEQUANT_MIN_CHUNK)]
    assert split_requests(batch, row, "mixed") == ([0, 4], [1, 3])  # empty chunk 2 in neither
    assert split_requests(batch, row, "auto") == ([0, 4], [1, 3])
    assert split_requests(batch, row, "dequant") == ([0, 1, 3, 4], [])
    many = [(0, 0, 128)] * (DEQUANT_MAX_REQUESTS + 1)
    assert split_requests(many, row, "auto") == ([], list(range(len(many))))  # an SDPA call each: fused
    assert split_requests(many, row, "mixed")[0] == list(range(len(many)))
    too_long = DEQUANT_MAX_BYTES // (2 * row) + 1
    assert split_requests([(too_long - 2048, 0, 2048)], row, "auto") == ([], [0])


@pytest.mark.parametrize("precision", ["ieee", "bf16"])
def test_extend_mixed_batch_matches_reference(seed, precision):
    # method "mixed" (the CUDA default): long chunks by gather + SDPA, decode rows and short chunks
    # by the fused kernel, as sub-batches whose rows are scattered back
    hkv, d = 2, 64
    kv, seg = random_mixed_cache([37, 50, 0, 9, 20], [10, 3, 0, 4, 0], hkv, d, seed=seed)
    q, k, v, indptr = _chunk([70, 1, 0, 5, 64], 4 * hkv, hkv, d)
    rk = torch.linalg.qr(torch.randn(hkv, d, d, dtype=torch.float64))[0].float()
    out = int2_extend_attention(q, k, v, kv, seg, indptr, k_rotation=rk, precision=precision, method="mixed",
                                host_lengths=[(37, 10, 70), (50, 3, 1), (0, 0, 0), (9, 4, 5), (20, 0, 64)])
    ref = extend_attention_reference(rotate_heads(q, rk), rotate_heads(k, rk), v, kv, seg, indptr)
    atol, rtol = (2e-6, 1e-5) if precision == "ieee" else (3e-2, 2e-2)
    assert_close_verbose(out, ref.float(), atol, rtol, what=f"mixed {precision}")


def test_gather_never_writes_past_the_host_allotment(seed):
    # host lengths that under-state the device's: the rows they allot are written, nothing beyond
    from oscar_ray.kernels.extend_dequant import gather_extend_kv

    kv, seg = random_mixed_cache([19, 9], [5, 0], 2, 64, seed=seed)
    _, k, v, indptr = _chunk([4, 3], 2, 2, 64)
    right = gather_extend_kv(kv, seg, k, v, indptr, [(19, 5, 4), (9, 0, 3)], torch.float32)[0]
    short = gather_extend_kv(kv, seg, k, v, indptr, [(10, 5, 4), (9, 0, 3)], torch.float32)[0]
    assert short.shape[0] == 31 and torch.equal(short[:19], right[:19])  # request 0's first 19 rows
    assert torch.equal(short[19:], right[28:])  # request 1 starts at its allotted offset
