"""The whole kernel path of one layer: bf16_write / int2_write / demote_pages fill a cache, decode reads it.

Rows are dyadic and R = (signed permutation)·Hadamard has entries ±1/8, so every rotated value is
exact in fp32 and the written cache equals the float64 math core (fake_quantize) exactly.
"""

import torch

from oscar_ray.kernels import PagedKV, Segments, bf16_write, demote_pages, int2_decode_attention, int2_write
from oscar_ray.kernels.reference import bf16_write_reference, request_kv, rotate_heads
from oscar_ray.quant import fake_quantize, hadamard, reference_attention
from tests.utils import assert_close_verbose

PAGE, D, HKV, G = 8, 64, 2, 4


def _exact_rotation():
    perm = torch.eye(D)[torch.randperm(D)] * torch.where(torch.rand(D) < 0.5, -1.0, 1.0)[:, None]
    return (perm @ hadamard(D, torch.float32)).contiguous()


def _slots(pages, n):
    flat = torch.tensor([p * PAGE + i for p in pages for i in range(PAGE)][:n])
    return (flat // PAGE).int(), (flat % PAGE).int()


def test_write_demote_decode_pipeline(seed):
    r_k, r_v, clip_k, clip_v = _exact_rotation(), _exact_rotation(), 0.9, 0.0
    n_sink, n_direct, n_demoted, n_recent = 8, 21, 16, 11
    rows = {name: [torch.randint(-32, 33, (n, HKV, D)).float() / 8 for _ in "kv"]
            for name, n in (("sink", n_sink), ("direct", n_direct), ("demoted", n_demoted), ("recent", n_recent))}
    codes = [torch.zeros(10, PAGE, HKV, D // 4, dtype=torch.uint8) for _ in "kv"]
    scales = [torch.zeros(10, PAGE, HKV, 2, dtype=torch.float16) for _ in "kv"]
    bf16 = [torch.zeros(8, PAGE, HKV, D, dtype=torch.bfloat16) for _ in "kv"]
    for i, (r, clip) in enumerate(((r_k, clip_k), (r_v, clip_v))):
        bf16_write(rows["sink"][i], r, *_slots([3], n_sink), bf16[i])
        bf16_write(rows["recent"][i], r, *_slots([4, 0], n_recent), bf16[i])
        int2_write(rows["direct"][i], r, clip, *_slots([7, 2, 5], n_direct), codes[i], scales[i])
        bf16_write(rows["demoted"][i], r, *_slots([1, 6], n_demoted), bf16[i])  # recent pages that age out
        demote_pages(bf16[i], torch.tensor([1, 6], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32),
                     codes[i], scales[i], clip)
    kv = PagedKV(codes[0], scales[0], codes[1], scales[1], bf16[0], bf16[1])
    # full (demoted) INT2 pages first, the partial page of the direct write last; sink then recent
    seg = Segments(torch.tensor([[0, 9, 7, 2, 5]], dtype=torch.int32), torch.tensor([n_demoted + n_direct]).int(),
                   torch.tensor([[3, 4, 0]], dtype=torch.int32), torch.tensor([n_sink + n_recent]).int())

    k_rot, v_rot = request_kv(kv, seg, 0)  # rotated basis, [T, Hkv, d]
    for i, (r, clip, x) in enumerate(((r_k, clip_k, k_rot), (r_v, clip_v, v_rot))):
        # fake_quantize answers in the original basis (float64); compare in the rotated one, where the
        # cache holds (c − z)·s in fp32: agreement to fp32 rounding of values up to ~30
        want = fake_quantize(rows["direct"][i], r, clip, scale_dtype="float16") @ r.double()
        assert_close_verbose(x[n_demoted : n_demoted + n_direct], want, 1e-6, 1e-6, what="int2_write vs core")
        demoted_rows = bf16_write_reference(rows["demoted"][i], r)  # demotion quantises the stored bf16 rows
        want = fake_quantize(demoted_rows, None, clip, scale_dtype="float16")
        assert_close_verbose(x[:n_demoted], want, 1e-6, 1e-6, what="demote vs core")
        assert torch.equal(x[n_demoted + n_direct :], torch.cat([bf16_write_reference(rows[n][i], r).float()
                                                                   for n in ("sink", "recent")]))

    q = torch.randn(1, HKV * G, D)
    out = int2_decode_attention(q, kv, seg, k_rotation=r_k, v_rotation=r_v, num_splits=2, block_n=16,
                                precision="ieee")
    ref = reference_attention(rotate_heads(q, r_k)[0:1], k_rot, v_rot, causal=False)
    assert_close_verbose(out, rotate_heads(ref, r_v, transpose=True), 5e-5, 1e-4, what="decode")
