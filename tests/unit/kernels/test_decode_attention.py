"""Split-K decode attention over the mixed cache against reference_attention on the dequantised cache."""

import dataclasses

import pytest
import torch

from oscar_ray.kernels import Segments, bf16_write_kv, int2_decode_attention, int2_write_kv
from oscar_ray.kernels.reference import decode_attention_reference, rotate_heads
from oscar_ray.kernels.synthetic import random_mixed_cache
from tests.utils import assert_close_verbose

# precision → (atol, rtol) for these caches (|v| <~ 1, |o| ~ 0.1-0.2).  Measured max errors: ieee
# 4e-8 (fp32 accumulation order), tf32 2e-5 and fp16 4e-5 (11-bit operands), bf16 9e-4 (8-bit
# operands; the interpreter truncates to bf16 where the GPU rounds, so the GPU does better)
TOLERANCES = {"ieee": (1e-6, 1e-5), "tf32": (1e-4, 1e-3), "fp16": (2e-4, 1e-3), "bf16": (3e-3, 1e-2)}


def _lens(batch: int):
    """Mixed lengths with the edge cases: an empty tier, one token, a partial last page."""
    int2 = [0, 1, 77, 40, 16][:batch]
    bf16 = [13, 0, 9, 1, 0][:batch]
    return int2, bf16


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("g", [1, 3, 4, 8, 12])
def test_decode_matches_reference(seed, d, g):
    hkv = 2 if g < 8 else 1
    int2, bf16 = _lens(4)
    kv, seg = random_mixed_cache(int2, bf16, hkv, d, seed=seed)
    q = torch.randn(len(int2), hkv * g, d)
    out = int2_decode_attention(q, kv, seg, num_splits=3, bf16_splits=2, block_n=16, bf16_block_n=16,
                                precision="ieee")
    atol, rtol = TOLERANCES["ieee"]
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), atol, rtol, f"d={d} g={g}")


@pytest.mark.parametrize("group_size, scale_dtype, head_major", [(None, torch.float16, False), (32, torch.float32, False),
                                                                (16, torch.float16, False), (None, torch.float16, True),
                                                                (16, torch.float32, True)])
def test_decode_groups_and_scale_dtypes(seed, group_size, scale_dtype, head_major):
    kv, seg = random_mixed_cache([50, 9], [3, 20], 2, 64, group_size=group_size, scale_dtype=scale_dtype,
                                 bf16_page_size=16, seed=seed, head_major_scales=head_major,
                                 head_major_codes=head_major)
    q = torch.randn(2, 8, 64)
    out = int2_decode_attention(q, kv, seg, num_splits=2, block_n=32, precision="ieee")
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *TOLERANCES["ieee"], what=str(group_size))


def test_split_count_invariance(seed):
    kv, seg = random_mixed_cache([300, 5, 0], [70, 0, 12], 2, 64, seed=seed)
    q = torch.randn(3, 8, 64)
    outs = [int2_decode_attention(q, kv, seg, num_splits=s, bf16_splits=s16, block_n=16, bf16_block_n=16,
                                  precision="ieee") for s, s16 in ((1, 1), (4, 2), (16, 8))]
    for o in outs[1:]:
        assert_close_verbose(o, outs[0], atol=1e-6, rtol=1e-5, what="splits")


def test_empty_requests_and_tables(seed):
    # no INT2 pages at all ([B, 0] table) and one request with no tokens anywhere → o = 0 there
    kv, seg = random_mixed_cache([0, 0], [0, 7], 2, 64, seed=seed)
    assert seg.int2_page_table.shape == (2, 0)
    q = torch.randn(2, 4, 64)
    out = int2_decode_attention(q, kv, seg, num_splits=4, precision="ieee")
    assert torch.equal(out[0], torch.zeros_like(out[0])) and not bool(out.isnan().any())
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *TOLERANCES["ieee"], what="empty")


def test_rotations_and_default_heuristics(seed):
    # launcher-side q·R_K and o·R_Vᵀ with per-KV-head rotations; default splits, blocks and precision
    d, hkv, g = 64, 2, 4
    kv, seg = random_mixed_cache([130, 64], [40, 320], hkv, d, seed=seed)
    rk = torch.linalg.qr(torch.randn(hkv, d, d, dtype=torch.float64))[0].float()
    rv = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0].float()
    q = torch.randn(2, hkv * g, d, dtype=torch.bfloat16)
    out = int2_decode_attention(q, kv, seg, k_rotation=rk, v_rotation=rv, num_sms=8)  # 8 SMs: few programs
    ref = rotate_heads(decode_attention_reference(rotate_heads(q, rk), kv, seg), rv, transpose=True)
    assert_close_verbose(out, ref, *TOLERANCES["bf16"], what="rotated, default bf16")


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("group_size", [None, 32])
def test_tensor_core_precisions(seed, precision, group_size):
    # factored (one group) and dequantising (two groups) INT2 paths under each operand rounding
    kv, seg = random_mixed_cache([90, 200], [33, 0], 2, 128, group_size=group_size, seed=seed)
    q = torch.randn(2, 16, 128)
    out = int2_decode_attention(q, kv, seg, num_splits=2, block_n=32, precision=precision)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *TOLERANCES[precision], what=precision)


def test_decode_argument_errors():
    kv, seg = random_mixed_cache([8], [8], 2, 64)
    q = torch.randn(1, 4, 64)
    with pytest.raises(ValueError, match="multiple"):
        int2_decode_attention(torch.randn(1, 3, 64), kv, seg)
    with pytest.raises(ValueError, match="q"):
        int2_decode_attention(torch.randn(2, 4, 64), kv, seg)
    with pytest.raises(ValueError, match="int2_lens"):
        int2_decode_attention(q, kv, Segments(seg.int2_page_table, seg.int2_lens.long(), seg.bf16_page_table,
                                              seg.bf16_lens))
    with pytest.raises(ValueError, match="precision"):
        int2_decode_attention(q, kv, seg, precision="fp8")
    with pytest.raises(ValueError, match="block_n"):
        int2_decode_attention(q, kv, seg, block_n=24)
    with pytest.raises(ValueError, match="k_rotation"):
        int2_decode_attention(q, kv, seg, k_rotation=torch.eye(32))
    with pytest.raises(ValueError, match="num_splits"):
        int2_decode_attention(q, kv, seg, num_splits=-2)
    with pytest.raises(ValueError, match="int2_kernel"):
        int2_decode_attention(q, kv, seg, int2_kernel="cutlass")
    with pytest.raises(ValueError, match="not on a CUDA device"):  # the CUDA tier kernel, asked for on CPU
        int2_decode_attention(q, kv, seg, int2_kernel="cuda")


@pytest.mark.parametrize("precision, group_size, d", [("ieee", None, 64), ("ieee", 32, 128), ("bf16", None, 128),
                                                      ("fp16", 16, 64)])
def test_three_bit_keys(seed, precision, group_size, d):
    # 3-bit key rows (d/4 + d/8 bytes, own strides) beside INT2 values, on the factored and the
    # dequantising paths; random bytes exercise every bit of the plane
    kv, seg = random_mixed_cache([0, 1, 77, 40], [13, 0, 9, 1], 2, d, group_size=group_size, key_bits=3,
                                 scale_dtype=torch.float16, seed=seed)
    assert kv.k_codes.shape[-1] == 3 * d // 8 and kv.k_codes.stride() != kv.v_codes.stride()
    q = torch.randn(4, 8, d)
    out = int2_decode_attention(q, kv, seg, num_splits=3, block_n=16, precision=precision)
    ref = decode_attention_reference(q, kv, seg)
    assert_close_verbose(out, ref, *TOLERANCES[precision], what=f"3-bit keys {precision} gs={group_size}")
    # the plane matters: the same cache read as INT2 keys (plane dropped) gives another answer
    k2 = kv.k_codes[..., : d // 4].contiguous()
    kv2 = type(kv)(k2, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16, group_size)
    assert (decode_attention_reference(q, kv2, seg) - ref).abs().max() > 1e-2


def test_three_bit_key_shape_errors():
    kv, seg = random_mixed_cache([8], [8], 2, 64, key_bits=3)
    bad = type(kv)(kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16, None, 2)
    with pytest.raises(ValueError, match="k_codes"):
        int2_decode_attention(torch.randn(1, 4, 64), bad, seg)
    with pytest.raises(ValueError, match="bits"):
        type(kv)(kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16, None, 4).geometry()



def test_fused_append_writes_the_slot_and_attends(seed):
    # append_k / append_v: the launch stores each request's new row into its last BF16-tier slot,
    # then attends over it; equal to writing the rows first (as the engine did) and attending
    int2, bf16 = [40, 0, 77, 16], [13, 1, 9, 0]  # request 3 has no BF16 token: nothing to write
    kv, seg = random_mixed_cache(int2, bf16, 2, 64, seed=seed)
    b, hkv, d = len(int2), 2, 64
    k_new, v_new = torch.randn(b, hkv, d), torch.randn(b, hkv, d)
    page = kv.k_bf16.shape[1]
    slots = [(int(seg.bf16_page_table[i, (n - 1) // page]), (n - 1) % page) for i, n in enumerate(bf16) if n]
    want_k, want_v = kv.k_bf16.clone(), kv.v_bf16.clone()
    for i, (p, o) in zip([i for i, n in enumerate(bf16) if n], slots):
        want_k[p, o], want_v[p, o] = k_new[i].to(torch.bfloat16), v_new[i].to(torch.bfloat16)
        kv.k_bf16[p, o] = kv.v_bf16[p, o] = 1e4  # stale values the kernel must overwrite before reading
    q = torch.randn(b, hkv * 4, d)
    out = int2_decode_attention(q, kv, seg, num_splits=3, bf16_splits=2, block_n=16, bf16_block_n=16,
                                precision="ieee", append_k=k_new, append_v=v_new)
    assert torch.equal(kv.k_bf16, want_k) and torch.equal(kv.v_bf16, want_v)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *TOLERANCES["ieee"], what="append")
    with pytest.raises(ValueError, match="append_k and append_v"):
        int2_decode_attention(q, kv, seg, append_k=k_new)
    with pytest.raises(ValueError, match="append_v"):
        int2_decode_attention(q, kv, seg, append_k=k_new, append_v=v_new[:, :1])


def test_cuda_tier_eligibility_names_what_is_missing(monkeypatch):
    # decode_cuda.cuda_unsupported on a CPU host, past its device checks: every layout rule reports
    # itself (a typo'd geometry field or a wrong rule would otherwise surface only on the GPU)
    from oscar_ray.kernels import decode_cuda

    class FakeQ:  # q as the launcher sees it on a CUDA device
        is_cuda, device = True, torch.device("cpu")

        def __init__(self, hq):
            self.shape = (1, hq, 128)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "_compile_kernel", lambda *a, **k: None, raising=False)

    def why(hq=32, precision="bf16", **cache):
        kv, _ = random_mixed_cache([64], [8], cache.pop("heads", 8), cache.pop("d", 128), **cache)
        return decode_cuda.cuda_unsupported(FakeQ(hq), kv, kv.geometry(), precision)

    assert why(scale_dtype=torch.float16) is None
    assert "fp32 scales" in why()
    assert "head_dim 64" in why(d=64, hq=32, scale_dtype=torch.float16)
    assert "groups" in why(group_size=64, scale_dtype=torch.float16)
    assert "3-bit keys" in why(key_bits=3, scale_dtype=torch.float16)
    assert "precision 'fp16'" in why(precision="fp16", scale_dtype=torch.float16)
    assert "GQA ratio 32" in why(hq=64, heads=2, scale_dtype=torch.float16)
    assert "page size 4" in why(int2_page_size=4, scale_dtype=torch.float16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "sm_80" in why(scale_dtype=torch.float16)


@pytest.mark.parametrize("scale_dtype, key_bits, per_head, head_major", [
    (torch.float16, 2, False, False), (torch.float32, 2, True, False), (torch.float16, 3, True, False),
    (torch.float16, 2, True, True)])
def test_fused_rotate_and_int2_append_equals_the_write_kernels(seed, scale_dtype, key_bits, per_head, head_major):
    # rotate_append + append_int2: the decode launch rotates the step's rows, stores them BF16 and
    # INT2 (the sglang pool's every-token copy), then attends: pages bit-equal to int2_write_kv +
    # bf16_write_kv of the same rows and output equal to the plain launch on those pages.  Dyadic
    # rows and rotations keep x·R exact in any summation order, so the codes can be compared with ==
    int2, bf16 = [40, 0, 77, 16], [13, 1, 9, 0]  # request 3: INT2 copy only (no BF16-tier slot)
    b, hkv, d = len(int2), 2, 64
    kv, seg = random_mixed_cache(int2, bf16, hkv, d, scale_dtype=scale_dtype, key_bits=key_bits, seed=seed,
                                 head_major_scales=head_major, head_major_codes=head_major)
    shape = (hkv, d, d) if per_head else (d, d)
    r_k, r_v = (torch.randint(-4, 5, shape).float() / 4 for _ in "kv")
    k_new, v_new = (torch.randint(-32, 33, (b, hkv, d)).float() / 8 for _ in "kv")
    used = set(seg.int2_page_table[seg.int2_lens > 0].flatten().tolist())
    free = [p for p in range(kv.k_codes.shape[0]) if p not in used]
    page2 = torch.tensor([free[i % len(free)] for i in range(b)], dtype=torch.int32)
    off2 = torch.tensor([i // len(free) for i in range(b)], dtype=torch.int32)
    page16 = kv.k_bf16.shape[1]
    rows = [i for i, n in enumerate(bf16) if n]
    p16 = torch.tensor([int(seg.bf16_page_table[i, (bf16[i] - 1) // page16]) for i in rows], dtype=torch.int32)
    o16 = torch.tensor([(bf16[i] - 1) % page16 for i in rows], dtype=torch.int32)
    ref = type(kv)(*(t.clone() for t in (kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16)),
                   kv.group_size, kv.key_bits)
    int2_write_kv(k_new, v_new, r_k, r_v, 0.96, 0.92, page2, off2, ref.k_codes, ref.k_scales, ref.v_codes,
                  ref.v_scales, key_bits=key_bits)
    bf16_write_kv(k_new[rows], v_new[rows], r_k, r_v, p16, o16, ref.k_bf16, ref.v_bf16)
    q = torch.randn(b, hkv * 4, d)
    args = dict(k_rotation=r_k, v_rotation=r_v, num_splits=3, bf16_splits=2, block_n=16, bf16_block_n=16,
                precision="ieee")
    out = int2_decode_attention(q, kv, seg, append_k=k_new, append_v=v_new, rotate_append=True,
                                append_int2=(page2, off2), append_clip=(0.96, 0.92), **args)
    for name in ("k_codes", "k_scales", "v_codes", "v_scales", "k_bf16", "v_bf16"):
        assert torch.equal(getattr(kv, name), getattr(ref, name)), name
    assert torch.equal(out, int2_decode_attention(q, ref, seg, **args))
    with pytest.raises(ValueError, match="append_int2 page_ids"):
        int2_decode_attention(q, kv, seg, append_k=k_new, append_v=v_new, append_int2=(page2.long(), off2))
    with pytest.raises(ValueError, match="append_clip"):
        int2_decode_attention(q, kv, seg, append_k=k_new, append_v=v_new, append_int2=(page2, off2),
                              append_clip=(1.5, 0.0))
    with pytest.raises(ValueError, match="need append_k"):
        int2_decode_attention(q, kv, seg, rotate_append=True)


def _signed_permutations(hkv: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """[H_kv, d, d] orthogonal rotations whose products with bf16 rows stay exact in bf16."""
    eye = torch.eye(d)
    return torch.stack([eye[torch.randperm(d, generator=gen)] * (torch.randint(0, 2, (d, 1), generator=gen) * 2 - 1)
                        for _ in range(hkv)])


@pytest.mark.parametrize("rotate", [False, True])
def test_attend_new_scores_the_rows_and_leaves_the_slot_unread(seed, rotate):
    # attend_new: the last BF16-tier token comes from the given rows (its slot holds NaN: read, it
    # would poison the output), equal to attention over a cache whose slot holds them; with
    # k_rotation the rows (and q) are in the model's basis, the cache in the rotated one
    int2, bf16 = [40, 0, 77, 16, 5], [13, 1, 9, 0, 64]  # request 3: no BF16 token, no new row
    b, hkv, d, g = len(int2), 2, 64, 4
    kv, seg = random_mixed_cache(int2, bf16, hkv, d, bf16_page_size=16, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    r_k = _signed_permutations(hkv, d, gen) if rotate else None
    r_v = _signed_permutations(hkv, d, gen) if rotate else None
    k_new = torch.randn(b, hkv, d, generator=gen).to(torch.bfloat16)
    v_new = torch.randn(b, hkv, d, generator=gen).to(torch.bfloat16)
    q = torch.randn(b, hkv * g, d, generator=gen)
    ref_kv = dataclasses.replace(kv, k_bf16=kv.k_bf16.clone(), v_bf16=kv.v_bf16.clone())
    page = kv.k_bf16.shape[1]
    for i, n in enumerate(bf16):
        if n:
            p, o = int(seg.bf16_page_table[i, (n - 1) // page]), (n - 1) % page
            ref_kv.k_bf16[p, o] = rotate_heads(k_new[i][None], r_k)[0].to(torch.bfloat16)
            ref_kv.v_bf16[p, o] = v_new[i]
            kv.k_bf16[p, o] = kv.v_bf16[p, o] = float("nan")
    before = kv.k_bf16.clone()
    out = int2_decode_attention(q, kv, seg, k_rotation=r_k, v_rotation=r_v, num_splits=3, bf16_splits=3,
                                block_n=16, bf16_block_n=16, precision="ieee", attend_new=(k_new, v_new))
    want = rotate_heads(decode_attention_reference(rotate_heads(q, r_k), ref_kv, seg).float(), r_v, transpose=True)
    assert_close_verbose(out, want, *TOLERANCES["ieee"], what="attend_new")
    assert torch.equal(kv.k_bf16.isnan(), before.isnan())  # the slot is not written either
    with pytest.raises(ValueError, match="attend_new and append_k"):
        int2_decode_attention(q, kv, seg, append_k=k_new, append_v=v_new, attend_new=(k_new, v_new))
    with pytest.raises(ValueError, match="attend_new v_new"):
        int2_decode_attention(q, kv, seg, attend_new=(k_new, v_new[:, :1]))
    with pytest.raises(ValueError, match="pair"):
        int2_decode_attention(q, kv, seg, attend_new=k_new)
    with pytest.raises(ValueError, match="overlap_tiers must be"):
        int2_decode_attention(q, kv, seg, overlap_tiers="yes")


@pytest.mark.parametrize("with_v", [True, False])
def test_store_new_writes_the_slots_in_the_q_rotation_launch(seed, with_v):
    # store_new: the step's rows (model basis) stored BF16 into their slots by the q rotation's launch
    # (rotate.py), then read there by the attention: pages equal to bf16_write_kv's, output equal to
    # the same attention after a bf16_write_kv launch; with v_new None only the K slots are written
    int2, bf16 = [40, 0, 77, 16], [13, 1, 9, 64]
    b, hkv, d, g = len(int2), 2, 64, 4
    kv, seg = random_mixed_cache(int2, bf16, hkv, d, bf16_page_size=16, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    r_k, r_v = _signed_permutations(hkv, d, gen), _signed_permutations(hkv, d, gen)
    k_new, v_new = (torch.randn(b, hkv, d, generator=gen).to(torch.bfloat16) for _ in "kv")
    q = torch.randn(b, hkv * g, d, generator=gen)
    page = kv.k_bf16.shape[1]
    ids = torch.tensor([int(seg.bf16_page_table[i, (n - 1) // page]) for i, n in enumerate(bf16)], dtype=torch.int32)
    offs = torch.tensor([(n - 1) % page for n in bf16], dtype=torch.int32)
    ref_kv = dataclasses.replace(kv, k_bf16=kv.k_bf16.clone(), v_bf16=kv.v_bf16.clone())
    bf16_write_kv(k_new, v_new if with_v else None, r_k, r_v, ids, offs, ref_kv.k_bf16,
                  ref_kv.v_bf16 if with_v else None)
    opts = dict(k_rotation=r_k, v_rotation=r_v, num_splits=3, bf16_splits=3, block_n=16, bf16_block_n=16,
                precision="ieee")
    want = int2_decode_attention(q, ref_kv, seg, **opts)
    out = int2_decode_attention(q, kv, seg, store_new=(k_new, v_new if with_v else None, ids, offs), **opts)
    assert torch.equal(kv.k_bf16, ref_kv.k_bf16) and torch.equal(kv.v_bf16, ref_kv.v_bf16)
    assert torch.equal(out, want)
    with pytest.raises(ValueError, match="store_new needs k_rotation"):
        int2_decode_attention(q, kv, seg, store_new=(k_new, v_new, ids, offs))
    with pytest.raises(ValueError, match="not with append_k"):
        int2_decode_attention(q, kv, seg, k_rotation=r_k, attend_new=(k_new, v_new), store_new=(k_new, v_new, ids, offs))
    with pytest.raises(ValueError, match="store_new must be"):
        int2_decode_attention(q, kv, seg, k_rotation=r_k, store_new=(k_new, v_new))
