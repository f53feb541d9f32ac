"""The CUDA INT2-tier decode kernel (int2_decode.cu), run on the CPU by a lane-level emulator.

tests/unit/kernels/cuda_emu builds the kernel source itself with g++ (its inline-PTX primitives
replaced by emulated mma.sync / movmatrix / shuffles / cp.async, fragment maps from the PTX ISA) and
runs the launcher's own plan (decode_cuda.launch_plan).  So CI checks the kernel's numbers, not only
that it compiles (test_compile_cuda_sm90.py); tests/gpu runs the same checks on the hardware.
"""

import numpy as np
import pytest
import torch

from oscar_ray.kernels import decode_attention as dec
from oscar_ray.kernels import decode_cuda, int2_decode_attention
from oscar_ray.kernels.reference import decode_attention_reference
from oscar_ray.kernels.synthetic import random_mixed_cache
from tests.unit.kernels import cuda_emu
from tests.utils import assert_close_verbose, int2_tier_checksums

pytestmark = pytest.mark.skipif(cuda_emu.available() is not None, reason=str(cuda_emu.available()))
D = 128
LOG2E = 1.4426950408889634
BF16_TOL = (3e-3, 1e-2)  # bf16 q and P' operands, as tests/gpu's CUDA-tier test


@pytest.fixture
def cuda_tier(monkeypatch):
    """int2_decode_attention with its INT2 tier served by the emulated kernel, as int2_kernel="cuda"
    does on a GPU (the BF16 tier and the merge stay the Triton kernels, interpreted); set keys of
    the returned dict to pass launcher options (warps, pipe, shiftless) or early=True."""
    options: dict = {}

    def tier(q, kv, geo, seg, mid_o, mid_lse, qk_scale, n_splits, **kw):
        opts = dict(options)
        early = opts.pop("early", False)
        plan = decode_cuda.launch_plan(q, kv, geo, seg, mid_o, mid_lse, qk_scale, n_splits, **{**kw, **opts})
        cuda_emu.run(plan, early)

    monkeypatch.setattr(dec, "cuda_unsupported", lambda *a: None)
    monkeypatch.setattr(dec, "int2_tier_cuda", tier)
    return options


def _cache(g, page, int2, bf16, seed, head_major_scales=False, head_major_codes=False):
    hkv = 2 if g < 8 else 1
    kv, seg = random_mixed_cache(int2, bf16, hkv, D, int2_page_size=page, scale_dtype=torch.float16, seed=seed,
                                 head_major_scales=head_major_scales, head_major_codes=head_major_codes)
    return kv, seg, torch.randn(len(int2), hkv * g, D)


# lengths at the 16-token tile, 32-token step and page boundaries, an empty INT2 tier, one token
INT2 = [700, 0, 1, 16, 17, 31, 32, 33, 4 * 128 + 15]
BF16 = [320, 5, 0, 64, 1, 263, 320, 8, 100]


@pytest.mark.parametrize("g, page", [(1, 8), (3, 16), (4, 8), (4, 64), (8, 8), (12, 32), (16, 8)])
def test_cuda_tier_matches_reference(cuda_tier, seed, g, page):
    kv, seg, q = _cache(g, page, INT2, BF16, seed)
    ref = decode_attention_reference(q, kv, seg)
    for splits in (None, 7) if g != 4 else (None, 1, 7, 200):  # 200: CTAs and warps without tokens
        out = int2_decode_attention(q, kv, seg, num_splits=splits, bf16_splits=2)
        assert_close_verbose(out, ref, *BF16_TOL, what=f"g={g} page={page} splits={splits}")


@pytest.mark.parametrize("g, page, pipe, codes, half_rows, bulk", [
    (4, 8, None, False, False, False), (4, 64, None, True, False, False), (3, 16, 0, True, False, False),
    (4, 8, None, True, True, False), (4, 8, None, True, False, True), (12, 32, 3, True, False, True),
    (1, 64, 5, True, False, True)])
def test_cuda_tier_head_major_pages(cuda_tier, seed, g, page, pipe, codes, half_rows, bulk):
    # (s, z) stored [page, kv_head, token, 2], and the code rows too where `codes`: the kernel takes
    # the token strides as compile-time constants and the head strides as arguments
    kv, seg, q = _cache(g, page, INT2, BF16, seed, head_major_scales=True, head_major_codes=codes)
    assert kv.k_scales.stride(1) == 2  # (one KV head at GQA >= 8: head-major is also contiguous)
    assert (kv.k_codes.stride(1) == D // 4) == codes
    cuda_tier.update(pipe=pipe, half_rows=half_rows, bulk=bulk)
    out = int2_decode_attention(q, kv, seg, num_splits=3, bf16_splits=2)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *BF16_TOL,
                         what=f"page {page} pipe {pipe} codes {codes} bulk {bulk}")


@pytest.mark.parametrize("opts", [{"warps": 1}, {"warps": 2}, {"warps": 8}, {"shiftless": 0}, {"shiftless": 1}, {"half_rows": True}, {"half_rows": True, "warps": 2, "pipe": 6},
                                  {"pipe": 0}, {"pipe": 0, "warps": 2}, {"pipe": 4}, {"pipe": 5, "warps": 2},
                                  {"lookahead": True}, {"lookahead": True, "pipe": 3, "warps": 1}, {"kchains": 2},
                                  {"kchains": 2, "pipe": 0}, {"kchains": 2, "lookahead": True, "pipe": 5}])
def test_cuda_tier_launcher_options(cuda_tier, seed, opts):
    kv, seg, q = _cache(4, 16, [600, 33, 0], [70, 0, 9], seed)
    cuda_tier.update(opts)
    out = int2_decode_attention(q, kv, seg, num_splits=3, bf16_splits=2)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *BF16_TOL, what=str(opts))


@pytest.mark.parametrize("copies", ["lane", "half_rows", "bulk", "auto"])
def test_cuda_copies_selects_the_refill(cuda_tier, seed, copies, monkeypatch):
    kv, seg, q = _cache(4, 8, [600, 33, 0], [70, 0, 9], seed, head_major_scales=True, head_major_codes=True)
    seen = []
    run = cuda_emu.run
    monkeypatch.setattr(cuda_emu, "run", lambda plan, early: (seen.append(plan.source_args[-6:-3]), run(plan, early)))
    out = int2_decode_attention(q, kv, seg, num_splits=3, bf16_splits=2, cuda_copies=copies)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *BF16_TOL, what=copies)
    # source_args end (half_rows, read_only, bulk, lookahead, kchains, page_ahead); auto on the CPU emulator (no sm_90) is per lane
    assert seen == [(copies == "half_rows", False, copies == "bulk")]


def test_cuda_copies_errors(cuda_tier, seed):
    kv, seg, q = _cache(4, 8, [600, 33], [70, 0], seed)  # token-major pages
    with pytest.raises(ValueError, match="cuda_copies"):
        int2_decode_attention(q, kv, seg, cuda_copies="tma")
    with pytest.raises(ValueError, match="bulk needs head-major pages"):
        int2_decode_attention(q, kv, seg, cuda_copies="bulk")


@pytest.mark.parametrize("policy", ["lane", "half_rows", "bulk"])
def test_default_copies_policy(seed, policy, monkeypatch):
    monkeypatch.setattr(decode_cuda, "HEAD_MAJOR_COPIES", policy)
    token, _ = random_mixed_cache([40], [0], 2, D, int2_page_size=8, scale_dtype=torch.float16, seed=seed)
    head, _ = random_mixed_cache([40], [0], 2, D, int2_page_size=8, scale_dtype=torch.float16, seed=seed,
                                 head_major_scales=True, head_major_codes=True)
    odd, _ = random_mixed_cache([40], [0], 2, D, int2_page_size=24, scale_dtype=torch.float16, seed=seed,
                                head_major_scales=True, head_major_codes=True)
    pick = decode_cuda.default_copies
    assert pick(token, token.geometry(), (9, 0)) == "lane"  # bulk needs a KV head's rows contiguous
    assert pick(head, head.geometry(), (9, 0)) == policy
    assert pick(head, head.geometry(), (8, 0)) == ("lane" if policy == "bulk" else policy)  # no cp.async.bulk
    assert pick(odd, odd.geometry(), (9, 0)) == ("lane" if policy == "bulk" else policy)  # 24 does not divide 32


@pytest.mark.parametrize("pipe", [0, decode_cuda.DEFAULT_PIPE])
def test_running_max_that_keeps_rising(cuda_tier, seed, pipe):
    # key scales growing along each request (x1 .. x5) and q x 2: a warp's later steps score far above
    # its earlier ones, so the lazy reference max moves mid-split (by more than its 2^8 slack) and
    # the accumulators must be rescaled there, not only at a split's first step
    kv, seg, q = _cache(4, 8, [900, 300], [40, 0], seed)
    for b, n in enumerate(seg.int2_lens.tolist()):
        for j in range(-(-n // 8)):
            kv.k_scales[seg.int2_page_table[b, j], ..., 0] *= 1 + 4 * j * 8 / n
    q = q * 2
    cuda_tier.update(pipe=pipe)
    out = int2_decode_attention(q, kv, seg, num_splits=1, bf16_splits=1)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), *BF16_TOL, what=f"pipe {pipe}")


def _partials(q, kv, seg, splits, pipe, early, warps=4, half_rows=False, read_only=False, fill=float("nan"),
              bulk=False, lookahead=False, page_ahead=1):
    b, hq, _ = q.shape
    mid_o = torch.full((b, hq, splits, D), fill)
    mid_lse = torch.full((b, hq, splits), fill)
    plan = decode_cuda.launch_plan(q, kv, kv.geometry(), seg, mid_o, mid_lse, LOG2E / D**0.5, splits,
                                   warps=warps, pipe=pipe, half_rows=half_rows, read_only=read_only, bulk=bulk,
                                   lookahead=lookahead, page_ahead=page_ahead)
    cuda_emu.run(plan, early)
    return mid_o, mid_lse


@pytest.mark.parametrize("pipe, warps, half_rows, lookahead, page_ahead", [
    (3, 4, False, False, 1), (4, 4, False, False, 1), (6, 2, False, False, 1), (4, 4, True, False, 1),
    (3, 4, False, True, 1), (4, 4, False, True, 1), (5, 4, True, True, 1), (6, 2, False, True, 1),
    (3, 4, False, False, 2), (4, 4, True, False, 2), (4, 4, False, True, 2)])
def test_cp_async_ring_equals_register_path(seed, pipe, warps, half_rows, lookahead, page_ahead):
    # same arithmetic in the same order; only where the bytes wait differs (and, with lookahead, where
    # a step's scores are issued: beside the previous step's P'·V, its slot held one step longer).
    # Copies landing at the wait (the latest legal time) catch a read before it; landing at issue, a
    # slot refilled too early
    # 2000 tokens in 3 splits: >= 5 steps per warp, so every slot of the ring is refilled at least once
    kv, seg, q = _cache(12, 8, [2000, 40, 0, 1], [0, 0, 0, 0], seed)
    ref_o, ref_lse = _partials(q, kv, seg, 3, 0, False, warps)
    assert not ref_o.isnan().any() and not ref_lse.isnan().any()
    for early in (False, True):
        o, lse = _partials(q, kv, seg, 3, pipe, early, warps, half_rows, lookahead=lookahead, page_ahead=page_ahead)
        assert torch.equal(o, ref_o) and torch.equal(lse, ref_lse), f"pipe {pipe} early={early}"


@pytest.mark.parametrize("page, pipe, warps, lookahead, page_ahead", [
    (8, 4, 4, False, 1), (16, 3, 4, False, 1), (32, 6, 2, False, 1), (64, 4, 4, False, 1), (8, 3, 4, True, 1),
    (64, 5, 4, True, 1), (8, 4, 4, False, 2), (64, 3, 4, True, 2)])
def test_bulk_ring_equals_register_path(seed, page, pipe, warps, lookahead, page_ahead):
    # cp.async.bulk refills (one per page run, completing on the slot's mbarrier) feed the same
    # arithmetic: partials bit-equal to the register path's on the same head-major pages, with copies
    # landing at the wait (an under-counted expect_tx leaves bytes unlanded) or at issue
    # 2000 tokens in 3 splits: >= 5 steps per warp, every slot's barrier runs more than one phase
    lens = [2000, 40, 0, 1, 33, 8 * 37]
    kv, seg, q = _cache(12, page, lens, [0] * len(lens), seed, head_major_scales=True, head_major_codes=True)
    ref_o, ref_lse = _partials(q, kv, seg, 3, 0, False, warps)
    for early in (False, True):
        o, lse = _partials(q, kv, seg, 3, pipe, early, warps, bulk=True, lookahead=lookahead, page_ahead=page_ahead)
        assert torch.equal(o, ref_o) and torch.equal(lse, ref_lse), f"page {page} early={early}"


def test_bulk_needs_head_major_pages_and_whole_runs(seed):
    kv, seg, q = _cache(4, 8, [100], [0], seed)
    with pytest.raises(ValueError, match="head-major"):
        _partials(q, kv, seg, 2, 4, False, bulk=True)
    with pytest.raises(ValueError, match="bulk needs the cp.async ring"):
        _partials(q, kv, seg, 2, 0, False, bulk=True)
    kv, seg, q = _cache(4, 24, [100], [0], seed, head_major_scales=True, head_major_codes=True)
    with pytest.raises(ValueError, match="page size"):
        _partials(q, kv, seg, 2, 4, False, bulk=True)
    with pytest.raises(ValueError, match="pick one"):
        _partials(q, kv, seg, 2, 4, False, half_rows=True, bulk=True)
    with pytest.raises(ValueError, match="lookahead needs the cp.async ring"):
        _partials(q, kv, seg, 2, 0, False, lookahead=True)
    b, hq, _ = q.shape
    with pytest.raises(ValueError, match="page_ahead must be 1 or 2"):
        decode_cuda.launch_plan(q, kv, kv.geometry(), seg, torch.zeros(b, hq, 2, D), torch.zeros(b, hq, 2), 1.0, 2,
                                page_ahead=3)
    with pytest.raises(ValueError, match="kchains must be 1 or 2"):
        decode_cuda.launch_plan(q, kv, kv.geometry(), seg, torch.zeros(b, hq, 2, D), torch.zeros(b, hq, 2), 1.0, 2,
                                kchains=3)


def test_partial_rows_are_per_split_softmax(seed):
    # row s of (mid_o, mid_lse) is the softmax over split s's tokens alone: split_len = ceil(n / S)
    # rounded up to the 32-token step, so split 2 of 3 over 100 tokens holds tokens 64..99
    kv, seg, q = _cache(4, 8, [100], [0], seed)
    o, lse = _partials(q, kv, seg, 3, decode_cuda.DEFAULT_PIPE, False)
    for s, (lo, hi) in enumerate(((0, 64), (64, 100), (100, 100))):
        sub = random_mixed_cache([hi - lo], [0], 2, D, int2_page_size=8, scale_dtype=torch.float16)[1]
        if hi == lo:
            assert torch.isinf(lse[0, :, s]).all() and (lse[0, :, s] < 0).all() and (o[0, :, s] == 0).all()
            continue
        pages = seg.int2_page_table[:, lo // 8:(hi + 7) // 8].contiguous()
        sub = type(sub)(pages, torch.tensor([hi - lo], dtype=torch.int32), sub.bf16_page_table[:, :0],
                        torch.zeros(1, dtype=torch.int32))
        ref = decode_attention_reference(q, kv, sub)
        assert_close_verbose(o[0, :, s], ref[0], *BF16_TOL, what=f"split {s}")


@pytest.mark.parametrize("pipe, warps, half_rows, codes, bulk", [(4, 4, False, False, False), (3, 2, True, False, False),
                                                                (4, 4, False, True, False), (4, 4, True, True, False),
                                                                (4, 4, False, True, True), (3, 2, False, True, True)])
def test_read_only_ring_reads_every_byte_of_the_tier(seed, pipe, warps, half_rows, codes, bulk):
    # the benchmarks' copy ceiling (read_only) runs the ring's copies without the attention; its
    # per-warp checksums XOR to the XOR of each request's and head's code rows and (s, z) pairs, so
    # a copy that misses a page, a token or a byte, or reads past the tier, changes the sum
    int2 = [1000, 40, 0, 1, 31, 257]
    kv, seg, q = _cache(4, 8, int2, [0] * len(int2), seed, head_major_scales=codes, head_major_codes=codes)
    splits = 5
    o, lse = _partials(q, kv, seg, splits, pipe, False, warps, half_rows, read_only=True, fill=0.0, bulk=bulk)
    assert (lse == 0).all() and (o[:, :, :, warps:] == 0).all()  # nothing else is written
    words = o[:, ::4, :, :warps].contiguous().view(torch.int32).numpy().view(np.uint32)  # [b, kv head, split, warp]
    for (b, kh), want in int2_tier_checksums(kv, seg).items():
        got = int(np.bitwise_xor.reduce(words[b, kh].ravel(), initial=np.uint32(0)))
        assert got == want, f"request {b} (n {int2[b]}) head {kh}: {got:#x} != {want:#x}"


def test_read_only_needs_the_ring(seed):
    kv, seg, q = _cache(4, 8, [100], [0], seed)
    with pytest.raises(ValueError, match="read_only"):
        _partials(q, kv, seg, 2, 0, False, read_only=True)


@pytest.mark.parametrize("batch, ctx, splits", [
    (8, 32768, 8), (8, 65536, 8), (8, 131072, 16),  # one wave up to 8192 tokens a CTA, then two
    (1, 16384, 32), (1, 32768, 64),                  # the >= 512-tokens-a-CTA cap
    (1, 131072, 66), (32, 16384, 2), (32, 131072, 4)])
def test_cuda_split_policy_on_the_h100_sweep_shapes(batch, ctx, splits):
    # the counts decode_h200.md's 2026-12-07 sweeps measured fastest (132 SMs, 8 KV heads, ring on)
    assert decode_cuda.DEFAULT_PIPE >= 3
    assert decode_cuda.default_cuda_splits(batch, 8, ctx - 320, num_sms=132) == splits
    one_wave = 4 * 132 // (batch * 8)
    assert splits <= 2 * one_wave
