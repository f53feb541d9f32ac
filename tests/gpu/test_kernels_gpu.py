"""The Triton kernels on CUDA at Qwen3-8B geometry (32 q heads, 8 KV heads, d = 128); skipped without CUDA.

Same contracts as tests/unit/kernels (bit-exact writes, decode/extend vs the float64 reference on
the dequantised cache), at real sizes and with the GPU's own tensor-core precisions.
"""

import pytest
import torch

from oscar_ray.kernels import (
    bf16_write,
    bf16_write_kv,
    demote_pages,
    int2_decode_attention,
    int2_extend_attention,
    int2_write,
    int2_write_kv,
)
from oscar_ray.kernels.reference import (
    bf16_write_reference,
    decode_attention_reference,
    extend_attention_reference,
    int2_write_reference,
)
from oscar_ray.kernels.decode_cuda import int2_tier_cuda
from oscar_ray.kernels.synthetic import random_mixed_cache
from tests.utils import assert_close_verbose

pytestmark = pytest.mark.gpu

HQ, HKV, D, PAGE = 32, 8, 128, 8
CUDA = "cuda"
# (precision, atol, rtol) for |o| ~ 0.1 (decode) and ~1 (extend), as in tests/unit/kernels: ieee
# leaves fp32 accumulation order only; tf32 / fp16 round operands to 11 bits, bf16 to 8 bits
DECODE_TOL = [("ieee", 1e-6, 1e-5), ("tf32", 1e-4, 1e-3), ("fp16", 2e-4, 1e-3), ("bf16", 3e-3, 1e-2)]
EXTEND_TOL = [("ieee", 2e-6, 1e-5), ("fp16", 2e-3, 1e-3), ("bf16", 3e-2, 2e-2)]


def _dyadic(*shape):
    return (torch.randint(-32, 33, shape, device=CUDA).float() / 8)


def _slots(n, n_pages):
    flat = torch.randperm(n_pages * PAGE, device=CUDA)[:n]
    return (flat // PAGE).int(), (flat % PAGE).int(), flat


@pytest.mark.parametrize("group_size", [None, D // 2])
def test_three_bit_keys_cuda(seed, group_size):
    # key_bits 3 on the GPU: the write and demote kernels bit-exact, decode and extend at the default bf16
    n = 1000
    x = torch.randn(n, HKV, D, device=CUDA) * 3
    pid, off, flat = _slots(n, 200)
    n_groups = 1 if group_size is None else D // group_size
    codes = torch.zeros(200, PAGE, HKV, 3 * D // 8, dtype=torch.uint8, device=CUDA)
    scales = torch.zeros(200, PAGE, HKV, 2 * n_groups, dtype=torch.float16, device=CUDA)
    int2_write(x, None, 0.0, pid, off, codes, scales, group_size=group_size, bits=3)
    ref_c, ref_s = int2_write_reference(x, None, 0.0, group_size, torch.float16, bits=3)
    assert torch.equal(codes.flatten(0, 1)[flat], ref_c) and torch.equal(scales.flatten(0, 1)[flat], ref_s)
    pages = (torch.randn(16, PAGE, HKV, D, device=CUDA) * 2).to(torch.bfloat16)
    src, dst = torch.arange(16, device=CUDA, dtype=torch.int32), torch.randperm(200, device=CUDA)[:16].int()
    demote_pages(pages, src, dst, codes, scales, 0.0, group_size=group_size, bits=3)
    ref_c, ref_s = int2_write_reference(pages.flatten(0, 1), None, 0.0, group_size, torch.float16, bits=3)
    assert torch.equal(codes[dst.long()].flatten(0, 1), ref_c) and torch.equal(scales[dst.long()].flatten(0, 1), ref_s)

    int2, bf16 = [3001, 1, 777, 130], [320, 5, 0, 263]
    kv, seg = random_mixed_cache(int2, bf16, HKV, D, group_size=group_size, key_bits=3, scale_dtype=torch.float16,
                                 device=CUDA, seed=seed)
    q = torch.randn(len(int2), HQ, D, device=CUDA)
    out = int2_decode_attention(q, kv, seg)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), 3e-3, 1e-2, what=f"3-bit keys {group_size}")
    kv, seg = random_mixed_cache([1000], [64], HKV, D, group_size=group_size, key_bits=3, device=CUDA, seed=seed)
    qe, ke, ve = (torch.randn(300, h, D, device=CUDA) for h in (HQ, HKV, HKV))
    out = int2_extend_attention(qe, ke, ve, kv, seg)
    assert_close_verbose(out, extend_attention_reference(qe, ke, ve, kv, seg,
                                                         torch.tensor([0, 300], dtype=torch.int32, device=CUDA)),
                         3e-2, 2e-2, what="3-bit keys extend")


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("group_size", [None, D // 2])
@pytest.mark.parametrize("n", [1, 1000])
def test_int2_write_bit_exact_cuda(seed, scale_dtype, group_size, n):
    n_groups = 1 if group_size is None else D // group_size
    x = _dyadic(n, HKV, D).to(torch.bfloat16)
    r = torch.randint(-4, 5, (D, D), device=CUDA).float() / 4  # exact products and sums in fp32
    pid, off, flat = _slots(n, 200)
    codes = torch.zeros(200, PAGE, HKV, D // 4, dtype=torch.uint8, device=CUDA)
    scales = torch.zeros(200, PAGE, HKV, 2 * n_groups, dtype=scale_dtype, device=CUDA)
    int2_write(x, r, 0.96, pid, off, codes, scales, group_size=group_size)
    ref_c, ref_s = int2_write_reference(x, r, 0.96, group_size, scale_dtype)
    assert torch.equal(codes.flatten(0, 1)[flat], ref_c)
    assert torch.equal(scales.flatten(0, 1)[flat], ref_s)


def test_int2_write_unrotated_gaussian_bit_exact_cuda(seed):
    # no rotation: the kernel's IEEE divisions must reproduce torch's codes on arbitrary floats
    n = 4096
    x = torch.randn(n, HKV, D, device=CUDA) * 3
    pid, off, flat = _slots(n, 600)
    codes = torch.zeros(600, PAGE, HKV, D // 4, dtype=torch.uint8, device=CUDA)
    scales = torch.zeros(600, PAGE, HKV, 2, dtype=torch.float16, device=CUDA)
    int2_write(x, None, 0.96, pid, off, codes, scales)
    ref_c, ref_s = int2_write_reference(x, None, 0.96, None, torch.float16)
    assert torch.equal(codes.flatten(0, 1)[flat], ref_c)
    assert torch.equal(scales.flatten(0, 1)[flat], ref_s)


def test_bf16_write_and_demote_bit_exact_cuda(seed):
    n = 64
    x = _dyadic(n, HKV, D)
    r = torch.randint(-4, 5, (HKV, D, D), device=CUDA).float() / 4
    pid, off = (torch.arange(n, device=CUDA) // PAGE).int(), (torch.arange(n, device=CUDA) % PAGE).int()
    pages = torch.zeros(n // PAGE, PAGE, HKV, D, dtype=torch.bfloat16, device=CUDA)
    bf16_write(x, r, pid, off, pages)
    assert torch.equal(pages.flatten(0, 1), bf16_write_reference(x, r))
    codes = torch.zeros(20, PAGE, HKV, D // 4, dtype=torch.uint8, device=CUDA)
    scales = torch.zeros(20, PAGE, HKV, 2, dtype=torch.float32, device=CUDA)
    src = torch.arange(n // PAGE, device=CUDA, dtype=torch.int32)
    dst = torch.randperm(20, device=CUDA)[: n // PAGE].int()
    demote_pages(pages, src, dst, codes, scales, 0.96)
    ref_c, ref_s = int2_write_reference(pages.flatten(0, 1), None, 0.96, None, torch.float32)
    assert torch.equal(codes[dst.long()].flatten(0, 1), ref_c)
    assert torch.equal(scales[dst.long()].flatten(0, 1), ref_s)


@pytest.mark.parametrize("precision, atol, rtol", DECODE_TOL)
@pytest.mark.parametrize("group_size", [None, D // 2])
def test_decode_matches_reference_cuda(seed, precision, atol, rtol, group_size):
    int2, bf16 = [4000, 1, 0, 1500, 8191], [320, 0, 64, 263, 1]
    kv, seg = random_mixed_cache(int2, bf16, HKV, D, group_size=group_size, device=CUDA, seed=seed)
    q = torch.randn(len(int2), HQ, D, device=CUDA)
    out = int2_decode_attention(q, kv, seg, precision=precision)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), atol, rtol, what=precision)


@pytest.mark.parametrize("g, d, block_n, nreg", [(g, d, 128, None) for g in (1, 3, 4, 8, 12) for d in (64, 128)]
                         + [(4, 128, 128, 0), (4, 128, 64, None), (12, 64, 64, None)])
def test_decode_fast_layout_gqa_cuda(seed, g, d, block_n, nreg):
    # the one-group bf16 path (prmt/lop3 unpack; maxnreg 128 by default at block_n 128, 0 = ptxas) at
    # every GQA ratio and head_dim, with partial last pages and a request of one token
    hkv = 4 if g < 8 else 2
    int2, bf16 = [3001, 1, 777, 130], [320, 5, 0, 263]
    kv, seg = random_mixed_cache(int2, bf16, hkv, d, device=CUDA, seed=seed)
    q = torch.randn(len(int2), hkv * g, d, device=CUDA)
    out = int2_decode_attention(q, kv, seg, block_n=block_n, max_registers=nreg)
    assert_close_verbose(out, decode_attention_reference(q, kv, seg), 3e-3, 1e-2, what=f"g={g} d={d} {block_n}")


@pytest.mark.parametrize("two_pass, v_rotated", [(False, False), (True, False), (True, True)])
def test_kv_writes_one_launch_bit_exact_cuda(seed, two_pass, v_rotated):
    # int2_write_kv / bf16_write_kv (the engines' per-step writes) equal the reference for both sides
    n = 40
    k, v = _dyadic(n, HKV, D), _dyadic(n, HKV, D)
    rk = torch.randint(-4, 5, (HKV, D, D), device=CUDA).float() / 4
    rv = torch.randint(-4, 5, (D, D), device=CUDA).float() / 4 if v_rotated else None
    pid, off, flat = _slots(n, 9)
    kc, vc = (torch.zeros(9, PAGE, HKV, D // 4, dtype=torch.uint8, device=CUDA) for _ in "kv")
    ks, vs = (torch.zeros(9, PAGE, HKV, 2, dtype=torch.float16, device=CUDA) for _ in "kv")
    int2_write_kv(k, v, rk, rv, 0.96, 0.0, pid, off, kc, ks, vc, vs, two_pass=two_pass)
    for codes, scales, x, r, clip in ((kc, ks, k, rk, 0.96), (vc, vs, v, rv, 0.0)):
        ref_c, ref_s = int2_write_reference(x, r, clip, None, torch.float16)
        assert torch.equal(codes.flatten(0, 1)[flat], ref_c) and torch.equal(scales.flatten(0, 1)[flat], ref_s)
    kp, vp = (torch.zeros(9, PAGE, HKV, D, dtype=torch.bfloat16, device=CUDA) for _ in "kv")
    bf16_write_kv(k, v, rk, rv, pid, off, kp, vp)
    assert torch.equal(kp.flatten(0, 1)[flat], bf16_write_reference(k, rk))
    assert torch.equal(vp.flatten(0, 1)[flat], bf16_write_reference(v, rv))


def test_two_pass_write_equals_one_launch_cuda(seed):
    # real data and a real orthogonal rotation (not exact in fp32): the column-split rotation pass
    # sums each output in the same ascending-k FMA order as the one-launch kernel's 16-row slices,
    # so the two forms must store the same bytes
    n = 48
    k, v = torch.randn(n, HKV, D, device=CUDA) * 2, torch.randn(n, HKV, D, device=CUDA)
    rk = torch.linalg.qr(torch.randn(HKV, D, D, device=CUDA, dtype=torch.float64))[0].float()
    rv = torch.linalg.qr(torch.randn(D, D, device=CUDA, dtype=torch.float64))[0].float()
    pid, off, _ = _slots(n, 9)
    outs = []
    for two_pass in (False, True):
        kc, vc = (torch.zeros(9, PAGE, HKV, D // 4, dtype=torch.uint8, device=CUDA) for _ in "kv")
        ks, vs = (torch.zeros(9, PAGE, HKV, 2, dtype=torch.float16, device=CUDA) for _ in "kv")
        int2_write_kv(k, v, rk, rv, 0.96, 0.0, pid, off, kc, ks, vc, vs, two_pass=two_pass)
        outs.append((kc, ks, vc, vs))
    for a, b in zip(*outs):
        assert torch.equal(a, b), f"{int((a != b).sum())} of {a.numel()} differ"


def test_decode_split_invariance_cuda(seed):
    kv, seg = random_mixed_cache([20000, 300], [320, 320], HKV, D, device=CUDA, seed=seed)
    q = torch.randn(2, HQ, D, device=CUDA)
    outs = [int2_decode_attention(q, kv, seg, num_splits=s, precision="ieee") for s in (1, 4, 16)]
    for o in outs[1:]:
        assert_close_verbose(o, outs[0], 1e-6, 1e-5, what="splits")


def test_decode_cuda_graph_replay(seed):
    # the benchmark captures the launcher in a CUDA graph: replay must match eager, and follow new lengths
    kv, seg = random_mixed_cache([3000, 70], [320, 200], HKV, D, device=CUDA, seed=seed)
    q = torch.randn(2, HQ, D, device=CUDA)
    eager = int2_decode_attention(q, kv, seg, num_splits=8)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        int2_decode_attention(q, kv, seg, num_splits=8)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = int2_decode_attention(q, kv, seg, num_splits=8)
    graph.replay()
    assert torch.equal(static, eager)
    seg.int2_lens.copy_(torch.tensor([2500, 10], device=CUDA, dtype=torch.int32))
    graph.replay()
    assert_close_verbose(static, int2_decode_attention(q, kv, seg, num_splits=8), 1e-6, 1e-6, what="graph")


@pytest.mark.parametrize("method", ["fused", "dequant", "mixed"])  # "auto" (the default) is "mixed" here
@pytest.mark.parametrize("precision, atol, rtol", EXTEND_TOL)
def test_extend_matches_reference_cuda(seed, precision, atol, rtol, method):
    kv, seg = random_mixed_cache([2000, 0, 77], [64, 0, 8], HKV, D, device=CUDA, seed=seed)
    chunks = [300, 129, 1]
    n = sum(chunks)
    indptr = torch.tensor([0, 300, 429, 430], dtype=torch.int32, device=CUDA)
    q = torch.randn(n, HQ, D, device=CUDA, dtype=torch.bfloat16)
    k = torch.randn(n, HKV, D, device=CUDA, dtype=torch.bfloat16)
    v = torch.randn(n, HKV, D, device=CUDA, dtype=torch.bfloat16)
    out = int2_extend_attention(q, k, v, kv, seg, indptr, max_chunk=max(chunks), precision=precision, method=method)
    assert_close_verbose(out, extend_attention_reference(q, k, v, kv, seg, indptr), atol, rtol,
                         what=f"{method} {precision}")


@pytest.mark.parametrize("bf16_lens", [[320, 200, 7, 1], [64, 263, 320, 129]])
def test_decode_fused_append_equals_write_then_decode_cuda(seed, bf16_lens):
    # the fused ring write must be visible to the same launch's loads (bar.sync in the owner split):
    # output and pages bit-equal to bf16_write_kv followed by the plain launch, at the default tiles
    b = len(bf16_lens)
    kv, seg = random_mixed_cache([30000, 0, 4100, 900][:b], bf16_lens, HKV, D, device=CUDA, seed=seed)
    q = torch.randn(b, HQ, D, device=CUDA)
    k_new, v_new = torch.randn(b, HKV, D, device=CUDA), torch.randn(b, HKV, D, device=CUDA)
    page = kv.k_bf16.shape[1]
    last = seg.bf16_lens.long() - 1
    pid = seg.bf16_page_table.gather(1, (last // page)[:, None])[:, 0].int()
    off = (last % page).int()
    ref_k, ref_v = kv.k_bf16.clone(), kv.v_bf16.clone()
    bf16_write_kv(k_new, v_new, None, None, pid, off, ref_k, ref_v)
    kv.k_bf16[pid.long(), off.long()] = 1e4  # stale rows: a read before the write would show
    kv.v_bf16[pid.long(), off.long()] = 1e4
    for splits in (None, 3):
        fused = int2_decode_attention(q, kv, seg, bf16_splits=splits, append_k=k_new, append_v=v_new)
        assert torch.equal(kv.k_bf16, ref_k) and torch.equal(kv.v_bf16, ref_v)
        kv.k_bf16[pid.long(), off.long()] = 1e4
        kv.v_bf16[pid.long(), off.long()] = 1e4
        plain_kv = type(kv)(kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, ref_k, ref_v)
        assert torch.equal(fused, int2_decode_attention(q, plain_kv, seg, bf16_splits=splits)), splits


@pytest.mark.parametrize("g, page", [(1, 8), (3, 16), (4, 8), (4, 64), (8, 8), (12, 32), (16, 8)])
def test_decode_cuda_int2_tier_matches_reference_cuda(seed, g, page):
    # decode_cuda.py's kernel (fp16 scales, bf16): lengths at 16-token tile, 32-token step and page
    # boundaries, an empty INT2 tier and one token; splits that leave CTAs and warps without tokens
    hkv = 4 if g < 8 else 2
    int2 = [3001, 0, 1, 16, 17, 31, 32, 33, 4096 + 15]
    kv, seg = random_mixed_cache(int2, [320, 5, 0, 64, 1, 263, 320, 8, 100], hkv, D, int2_page_size=page,
                                 scale_dtype=torch.float16, device=CUDA, seed=seed)
    q = torch.randn(len(int2), hkv * g, D, device=CUDA)
    ref = decode_attention_reference(q, kv, seg)
    for splits in (None, 1, 7, 200):
        out = int2_decode_attention(q, kv, seg, int2_kernel="cuda", num_splits=splits)
        assert_close_verbose(out, ref, 3e-3, 1e-2, what=f"cuda g={g} page={page} splits={splits}")
    mid_o = torch.empty(len(int2), hkv * g, 9, D, device=CUDA)
    for pipe in (3, 4):  # the cp.async ring (decode_cuda pipe > 0) gives the register path's partials
        parts = []
        for p in (0, pipe):
            mid_o.fill_(float("nan"))
            mid_lse = torch.full((len(int2), hkv * g, 9), float("nan"), device=CUDA)
            int2_tier_cuda(q, kv, kv.geometry(), seg, mid_o, mid_lse, 0.125, 9, pipe=p)
            parts.append((mid_o.clone(), mid_lse.clone()))
        for a, b in zip(*parts):  # same arithmetic in the same order; only where the bytes wait differs
            assert not a.isnan().any()
            assert_close_verbose(b, a, 1e-6, 1e-6, what=f"pipe {pipe}")
    tri = int2_decode_attention(q, kv, seg, int2_kernel="triton")
    assert_close_verbose(int2_decode_attention(q, kv, seg), tri, 3e-3, 1e-2, what="auto vs triton")


def test_decode_cuda_int2_tier_graph_and_errors_cuda(seed):
    kv, seg = random_mixed_cache([5000, 70], [320, 200], HKV, D, scale_dtype=torch.float16, device=CUDA, seed=seed)
    q = torch.randn(2, HQ, D, device=CUDA)
    eager = int2_decode_attention(q, kv, seg, int2_kernel="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = int2_decode_attention(q, kv, seg, int2_kernel="cuda")
    graph.replay()
    assert torch.equal(static, eager)
    seg.int2_lens.copy_(torch.tensor([4000, 3], device=CUDA, dtype=torch.int32))
    graph.replay()
    assert torch.equal(static, int2_decode_attention(q, kv, seg, int2_kernel="cuda"))
    kv32, seg32 = random_mixed_cache([100], [10], HKV, D, device=CUDA, seed=seed)  # fp32 scales
    with pytest.raises(ValueError, match="fp32 scales"):
        int2_decode_attention(q[:1], kv32, seg32, int2_kernel="cuda")


@pytest.mark.parametrize("int2_kernel", ["cuda", "triton"])
def test_decode_fused_rotate_int2_append_equals_write_kernels_cuda(seed, int2_kernel):
    # the sglang decode step in one launch (rotate_append + append_int2) on real-valued rows and an
    # orthogonal rotation: the same bytes as int2_write_kv (one launch: the same sliced ascending-k
    # rotation) + bf16_write_kv, and the same output as the plain launch over those pages
    int2, bf16 = [3000, 70, 0], [320, 200, 9]
    b = len(int2)
    kv, seg = random_mixed_cache(int2, bf16, HKV, D, scale_dtype=torch.float16, device=CUDA, seed=seed, spare_pages=4)
    r_k = torch.linalg.qr(torch.randn(HKV, D, D, device=CUDA))[0].contiguous()
    k_new, v_new = (torch.randn(b, HKV, D, device=CUDA).to(torch.bfloat16) for _ in "kv")
    used = set(seg.int2_page_table.flatten().tolist())
    free = [p for p in range(kv.k_codes.shape[0]) if p not in used][:b]
    page2 = torch.tensor(free, dtype=torch.int32, device=CUDA)
    off2 = torch.tensor([1, 7, 3], dtype=torch.int32, device=CUDA)
    last = seg.bf16_lens.long() - 1
    p16 = seg.bf16_page_table.gather(1, (last // PAGE)[:, None])[:, 0].int()
    o16 = (last % PAGE).int()
    ref = type(kv)(*(t.clone() for t in (kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16)))
    int2_write_kv(k_new, v_new, r_k, None, 0.96, 0.0, page2, off2, ref.k_codes, ref.k_scales, ref.v_codes,
                  ref.v_scales, two_pass=False)
    bf16_write_kv(k_new, v_new, r_k, None, p16, o16, ref.k_bf16, ref.v_bf16)
    out = int2_decode_attention(q := torch.randn(b, HQ, D, device=CUDA), kv, seg, k_rotation=r_k,
                                int2_kernel=int2_kernel, append_k=k_new, append_v=v_new, rotate_append=True,
                                append_int2=(page2, off2), append_clip=(0.96, 0.0))
    for name in ("k_codes", "k_scales", "v_codes", "v_scales", "k_bf16", "v_bf16"):
        assert torch.equal(getattr(kv, name), getattr(ref, name)), name
    assert torch.equal(out, int2_decode_attention(q, ref, seg, k_rotation=r_k, int2_kernel=int2_kernel))
