"""The CUDA INT2 tier's ring variants on the hardware (Qwen3-8B geometry: 8 KV heads, GQA 4, d 128).

Small and first in tests/gpu (a device call may end before test_kernels_gpu.py's later tests):
half_rows and bulk refills and the lookahead loop against the register path, and the read_only copy ceiling's checksum,
so a device round that times them has also checked them.  Skipped without CUDA.
"""

import numpy as np
import pytest
import torch

from oscar_ray.kernels import int2_decode_attention
from oscar_ray.kernels.decode_cuda import int2_tier_cuda
from oscar_ray.kernels.reference import decode_attention_reference
from oscar_ray.kernels.synthetic import random_mixed_cache
from tests.utils import assert_close_verbose, int2_tier_checksums

pytestmark = pytest.mark.gpu

HKV, G, D = 8, 4, 128
INT2 = [3001, 0, 1, 33, 4096 + 15]
SPLITS = 9


def _cache(page, head_major, seed):
    return random_mixed_cache(INT2, [320, 5, 0, 64, 100], HKV, D, int2_page_size=page, scale_dtype=torch.float16,
                              device="cuda", seed=seed, head_major_scales=head_major, head_major_codes=head_major)


def _partials(q, kv, seg, **opts):
    mid_o = torch.full((len(INT2), HKV * G, SPLITS, D), float("nan"), device="cuda")
    mid_lse = torch.full((len(INT2), HKV * G, SPLITS), float("nan"), device="cuda")
    int2_tier_cuda(q, kv, kv.geometry(), seg, mid_o, mid_lse, 0.125, SPLITS, **opts)
    torch.cuda.synchronize()
    return mid_o, mid_lse


@pytest.mark.parametrize("page", [8, 64])
def test_ring_refills_equal_the_register_path_cuda(seed, page):
    # head-major pages (the layout bulk needs; the other refills read it through strides)
    kv, seg = _cache(page, True, seed)
    q = torch.randn(len(INT2), HKV * G, D, device="cuda")
    ref = _partials(q, kv, seg, pipe=0)
    assert not ref[0].isnan().any()
    for opts in ({"pipe": 4}, {"pipe": 4, "half_rows": True}, {"pipe": 4, "bulk": True}, {"pipe": 3, "bulk": True},
                 {"pipe": 4, "lookahead": True}, {"pipe": 5, "lookahead": True}, {"pipe": 5, "bulk": True, "lookahead": True},
                 {"pipe": 4, "page_ahead": 2}, {"pipe": 4, "bulk": True, "page_ahead": 2}):
        for a, b in zip(ref, _partials(q, kv, seg, **opts)):
            assert_close_verbose(b, a, 1e-6, 1e-6, what=str(opts))
    for opts in ({"pipe": 4, "kchains": 2}, {"pipe": 5, "lookahead": True, "kchains": 2}):
        # two score chains per tile: the same products summed in another order (fp32 rounding only)
        for a, b in zip(ref, _partials(q, kv, seg, **opts)):
            assert_close_verbose(b, a, 1e-4, 1e-4, what=str(opts))
    ref_o = decode_attention_reference(q, kv, seg)
    for copies in ("bulk", "half_rows"):  # the whole decode on each refill
        out = int2_decode_attention(q, kv, seg, int2_kernel="cuda", cuda_copies=copies)
        assert_close_verbose(out, ref_o, 3e-3, 1e-2, what=f"{copies} page {page}")


@pytest.mark.parametrize("head_major, opts", [(False, {}), (False, {"half_rows": True}), (True, {"bulk": True})])
def test_read_only_ring_checksum_cuda(seed, head_major, opts):
    kv, seg = _cache(8, head_major, seed)
    q = torch.randn(len(INT2), HKV * G, D, device="cuda")
    mid_o = torch.zeros(len(INT2), HKV * G, SPLITS, D, device="cuda")
    mid_lse = torch.zeros(len(INT2), HKV * G, SPLITS, device="cuda")
    int2_tier_cuda(q, kv, kv.geometry(), seg, mid_o, mid_lse, 0.125, SPLITS, pipe=4, read_only=True, **opts)
    words = mid_o[:, ::G, :, :4].contiguous().view(torch.int32).cpu().numpy().view(np.uint32)
    for (b, kh), want in int2_tier_checksums(kv, seg).items():
        got = int(np.bitwise_xor.reduce(words[b, kh].ravel(), initial=np.uint32(0)))
        assert got == want, f"{opts} request {b} head {kh}: {got:#x} != {want:#x}"
