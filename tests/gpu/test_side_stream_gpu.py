"""SideStream on the hardware: the INT2 write queued beside a decode launch lands bit-equal to the
same write in series, after inputs produced on the main stream, and before what follows the join.
Skipped without CUDA."""

import pytest
import torch

from oscar_ray.kernels import int2_decode_attention, int2_write_kv
from oscar_ray.kernels.side_stream import SideStream
from oscar_ray.kernels.synthetic import random_mixed_cache

pytestmark = pytest.mark.gpu

HKV, G, D, B = 8, 4, 128, 3


def _pages(kv):
    return [t.clone() for t in (kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales)]


def test_side_write_equals_the_write_in_series_cuda(seed):
    kv, seg = random_mixed_cache([4000, 900, 33], [320, 300, 5], HKV, D, device="cuda", seed=seed)
    r_k = torch.linalg.qr(torch.randn(D, D, device="cuda", dtype=torch.float64))[0].float().contiguous()
    q = torch.randn(B, HKV * G, D, device="cuda")
    page = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")  # pages the cache's tables name too:
    off = torch.tensor([5, 0, 7], dtype=torch.int32, device="cuda")   # the write must not race the read
    base = _pages(kv)
    side = SideStream("cuda")
    torch.cuda.synchronize()
    # inputs made on the main stream right before the side work: the side stream must wait for them
    # (a long matmul first, so a side stream that did not wait would read unfinished rows)
    big = torch.randn(4096, 4096, device="cuda")
    k = (big @ big)[:B * HKV, :D].reshape(B, HKV, D).contiguous() * 1e-3
    v = torch.randn(B, HKV, D, device="cuda")
    ref_out = int2_decode_attention(q, kv, seg, k_rotation=r_k)  # the read before any write
    torch.cuda.synchronize()
    for t, b in zip(_pages(kv), base):
        t.copy_(b)
    side.run(lambda: int2_write_kv(k, v, r_k, None, 0.96, 0.0, page, off, kv.k_codes, kv.k_scales,
                                   kv.v_codes, kv.v_scales), k, v)
    assert side.pending
    side.join()
    got = _pages(kv)  # after the join, on the main stream: must see the side write
    torch.cuda.synchronize()
    series = [b.clone() for b in base]
    int2_write_kv(k, v, r_k, None, 0.96, 0.0, page, off, *series)
    torch.cuda.synchronize()
    for a, b in zip(got, series):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(got, base))  # it wrote something
    assert torch.isfinite(ref_out).all()


@pytest.mark.parametrize("append", [False, True])
def test_overlapped_tiers_equal_the_tiers_in_series_cuda(seed, append):
    # the BF16 launch (with the step's append and INT2 writer programs) beside the CUDA INT2 tier:
    # outputs and every page bit-equal to the launches in series, eager and in a CUDA graph
    kv, seg = random_mixed_cache([5000, 70, 0], [320, 200, 9], HKV, D, scale_dtype=torch.float16, device="cuda",
                                 seed=seed, head_major_scales=True, head_major_codes=True)
    q = torch.randn(B, HKV * G, D, device="cuda")
    r_k = torch.linalg.qr(torch.randn(D, D, device="cuda", dtype=torch.float64))[0].float().contiguous()
    extra = dict(k_rotation=r_k, int2_kernel="cuda")
    if append:
        new_k, new_v = (torch.randn(B, HKV, D, device="cuda") for _ in "kv")
        used = set(seg.int2_page_table.flatten().tolist())  # INT2 slots in pages no table names
        free = [p for p in range(kv.k_codes.shape[0]) if p not in used][:B]
        assert len(free) == B
        slot = (torch.tensor(free, dtype=torch.int32, device="cuda"),
                torch.tensor([1, 0, 2], dtype=torch.int32, device="cuda"))
        extra.update(append_k=new_k, append_v=new_v, rotate_append=True, append_int2=slot, append_clip=(0.96, 0.0))
    pages = [kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16]
    base = [t.clone() for t in pages]
    serial = int2_decode_attention(q, kv, seg, overlap_tiers=False, **extra)
    after_serial = [t.clone() for t in pages]
    for t, b in zip(pages, base):
        t.copy_(b)
    overlapped = int2_decode_attention(q, kv, seg, overlap_tiers=True, **extra)  # "auto": two waves here, serial
    assert torch.equal(overlapped, serial)
    for a, b in zip(pages, after_serial):
        assert torch.equal(a, b)
    for t, b in zip(pages, base):
        t.copy_(b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = int2_decode_attention(q, kv, seg, overlap_tiers=True, **extra)
    for t, b in zip(pages, base):
        t.copy_(b)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, serial)


@pytest.mark.parametrize("int2_kernel", ["cuda", "triton"])
def test_attend_new_beside_the_side_write_equals_write_then_attend_cuda(seed, int2_kernel):
    # the sglang backend's "side" form: both copies of the step's token written on the side stream
    # while the attention takes the token from its rows; the pages equal the writes in series and
    # the output the attention over the written cache (within bf16 operand rounding)
    from oscar_ray.kernels import bf16_write_kv

    kv, seg = random_mixed_cache([5000, 70, 0], [320, 200, 9], HKV, D, scale_dtype=torch.float16, device="cuda",
                                 seed=seed, head_major_scales=True, head_major_codes=True)
    q = torch.randn(B, HKV * G, D, device="cuda").to(torch.bfloat16)
    r_k = torch.linalg.qr(torch.randn(D, D, device="cuda", dtype=torch.float64))[0].float().contiguous()
    k, v = (torch.randn(B, HKV, D, device="cuda").to(torch.bfloat16) for _ in "kv")
    used = set(seg.int2_page_table.flatten().tolist())
    free = torch.tensor([p for p in range(kv.k_codes.shape[0]) if p not in used][:B], dtype=torch.int32,
                        device="cuda")
    off2 = torch.tensor([1, 0, 2], dtype=torch.int32, device="cuda")
    last = seg.bf16_lens.long() - 1
    p16 = seg.bf16_page_table.gather(1, (last // kv.k_bf16.shape[1])[:, None])[:, 0].int()
    o16 = (last % kv.k_bf16.shape[1]).int()
    pages = [kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, kv.k_bf16, kv.v_bf16]
    base = [t.clone() for t in pages]

    def write():
        int2_write_kv(k, v, r_k, None, 0.96, 0.0, free, off2, kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales)
        bf16_write_kv(k, v, r_k, None, p16, o16, kv.k_bf16, kv.v_bf16)

    write()
    want = int2_decode_attention(q, kv, seg, k_rotation=r_k, int2_kernel=int2_kernel)
    written = [t.clone() for t in pages]
    for t, b in zip(pages, base):
        t.copy_(b)
    kv.k_bf16[p16.long(), o16.long()] = float("nan")  # what a read before the side write lands would see
    side = SideStream("cuda")
    side.run(write, k, v)
    got = int2_decode_attention(q, kv, seg, k_rotation=r_k, int2_kernel=int2_kernel, attend_new=(k, v))
    side.join()
    torch.cuda.synchronize()
    for a, b in zip(pages, written):
        assert torch.equal(a, b)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=3e-3, rtol=1e-2)
