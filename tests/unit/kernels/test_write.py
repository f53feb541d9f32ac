"""Write kernels against the quant/ reference: codes, scales and bf16 rows must be bit-exact."""

import pytest
import torch

from oscar_ray.kernels import bf16_write, bf16_write_kv, demote_pages, demote_pages_kv, int2_write, int2_write_kv
from oscar_ray.kernels.reference import bf16_write_reference, int2_write_reference
from oscar_ray.kernels.layout import head_major as stored_head_major
from tests.utils import assert_close_verbose

PAGE = 8
SENTINEL = 0xA5


def _dyadic(*shape, scale=8):
    """Values k/scale with |k| <= 32: x·R with R entries j/4 is exact in fp32 in any summation order."""
    return torch.randint(-32, 33, shape).float() / scale


def _rotation(kind: str, h: int, d: int):
    if kind == "none":
        return None
    if kind == "dense":  # dyadic dense matrix: exact products and sums, so codes can be compared with ==
        return torch.randint(-4, 5, (d, d)).float() / 4
    if kind == "per_head":
        return torch.randint(-4, 5, (h, d, d)).float() / 4
    raise AssertionError(kind)


def _special_rows(x, rotated=True):
    """Rows that hit the floors: constant, zero, tiny range far from 0 (fp16 |z| cap), wide range.

    The wide row stays below fp16's 65504 after a dense dyadic R (row norm ~0.65·sqrt(d) ≈ 7.4).
    rotated: the rows are multiples of 1/8 (|x| < 2^11), so x·R with R entries j/4 needs at most
    17 + 5 bits and is exact in any summation order: the kernel's (interpreted tl.dot: numpy's BLAS)
    and the reference's (torch's) can differ by CPU, so an inexact row made the codes machine-dependent.
    The tiny range (1000 + 1e-3·noise, the fp16 |z| cap) is kept for unrotated rows only: a rotation
    spreads it anyway."""
    n = x.shape[0]
    if n >= 4:
        x[0, 0] = 1.5
        x[1, 0] = 0.0
        noise = torch.randn(x.shape[-1])
        x[2, 0] = 1000.0 + (torch.randint(-1, 2, noise.shape) / 8 if rotated else 1e-3 * noise)
        x[3, 0] = (300.0 * noise * 8).round() / 8 if rotated else 300.0 * noise
    return x


def _slots(n, n_pages, consecutive_from=None):
    if consecutive_from is not None:  # tokens run across page boundaries in order
        flat = torch.arange(consecutive_from, consecutive_from + n)
    else:
        flat = torch.randperm(n_pages * PAGE)[:n]
    return (flat // PAGE).int(), (flat % PAGE).int(), flat


def _pages(n_pages, h, d, groups, scale_dtype, bits=2, head_major=False):
    codes = torch.full((n_pages, PAGE, h, d * bits // 8), SENTINEL, dtype=torch.uint8)
    scales = torch.full((n_pages, PAGE, h, 2 * groups), -7.0, dtype=scale_dtype)
    if head_major:  # same logical [page, token, head, ...], stored [page, head, token, ...]
        codes, scales = stored_head_major(codes), stored_head_major(scales)
    return codes, scales


def _check_written(codes, scales, flat, ref_codes, ref_scales):
    c = codes.flatten(0, 1)
    s = scales.flatten(0, 1)
    assert torch.equal(c[flat], ref_codes), f"{int((c[flat] != ref_codes).sum())} code bytes differ"
    assert torch.equal(s[flat], ref_scales), f"{int((s[flat] != ref_scales).sum())} scales differ"
    untouched = torch.ones(c.shape[0], dtype=torch.bool)
    untouched[flat] = False
    assert bool((c[untouched] == SENTINEL).all()) and bool((s[untouched] == -7.0).all()), "wrote outside its slots"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("halves", [False, True])
@pytest.mark.parametrize("rot", ["none", "dense", "per_head"])
def test_int2_write_bit_exact(seed, d, scale_dtype, halves, rot):
    h, n, n_pages = 2, 37, 7
    gs = d // 2 if halves else None
    x = _special_rows(_dyadic(n, h, d)) if rot != "none" else _special_rows(torch.randn(n, h, d) * 3, rotated=False)
    r = _rotation(rot, h, d)
    clip = 0.9 if rot != "dense" else 0.0
    pid, off, flat = _slots(n, n_pages)
    codes, scales = _pages(n_pages, h, d, 2 if halves else 1, scale_dtype)
    int2_write(x, r, clip, pid, off, codes, scales, group_size=gs)
    _check_written(codes, scales, flat, *int2_write_reference(x, r, clip, gs, scale_dtype))


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("clip", [0.0, 0.5, 0.96, 1.0, 0.001])
@pytest.mark.parametrize("n, start", [(1, 5), (19, 6), (16, 0)])
def test_int2_write_clip_and_page_boundaries(seed, x_dtype, clip, n, start):
    # dyadic values have many ties in |x|, the hard case for an order statistic without a sort
    h, d, n_pages = 3, 64, 6
    x = _dyadic(n, h, d).to(x_dtype)
    r = _rotation("dense", h, d)
    pid, off, flat = _slots(n, n_pages, consecutive_from=start)
    codes, scales = _pages(n_pages, h, d, 1, torch.float32)
    int2_write(x, r, clip, pid, off, codes, scales)
    _check_written(codes, scales, flat, *int2_write_reference(x, r, clip, None, torch.float32))


def test_int2_write_orthogonal_rotation_close(seed):
    # a generic orthogonal R: x·R differs from torch's matmul in the last fp32 bit, so a code may move
    # at a bucket edge (rarely); scales agree to fp32 rounding
    h, n, d = 2, 64, 128
    x = torch.randn(n, h, d)
    r = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0].float()
    pid, off, flat = _slots(n, 16)
    codes, scales = _pages(16, h, d, 1, torch.float32)
    int2_write(x, r, 0.96, pid, off, codes, scales)
    ref_c, ref_s = int2_write_reference(x, r, 0.96, None, torch.float32)
    assert_close_verbose(scales.flatten(0, 1)[flat], ref_s, atol=1e-6, rtol=1e-5, what="scales")
    differ = (codes.flatten(0, 1)[flat] != ref_c).float().mean().item()
    assert differ < 0.01, f"{differ:.2%} of code bytes differ"


@pytest.mark.parametrize("rot", ["none", "dense", "per_head"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_bf16_write_bit_exact(seed, rot, x_dtype):
    h, n, d, n_pages = 2, 21, 128, 5
    x = _dyadic(n, h, d).to(x_dtype)
    r = _rotation(rot, h, d)
    pid, off, flat = _slots(n, n_pages)
    pages = torch.full((n_pages, PAGE, h, d), 3.0, dtype=torch.bfloat16)
    bf16_write(x, r, pid, off, pages)
    got = pages.flatten(0, 1)
    assert torch.equal(got[flat], bf16_write_reference(x, r))
    untouched = torch.ones(got.shape[0], dtype=torch.bool)
    untouched[flat] = False
    assert bool((got[untouched] == 3.0).all())


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("halves", [False, True])
@pytest.mark.parametrize("bits, clip", [(2, 0.96), (3, 0.0), (3, 0.96)])  # 3: the 3-bit key layout
def test_demote_pages_bit_exact(seed, d, scale_dtype, halves, bits, clip):
    h, n16, n2 = 2, 6, 9
    gs = d // 2 if halves else None
    src_pages = (torch.randn(n16, PAGE, h, d) * 2).to(torch.bfloat16)
    src = torch.tensor([4, 0, 2], dtype=torch.int32)
    dst = torch.tensor([1, 8, 5], dtype=torch.int32)
    codes, scales = _pages(n2, h, d, 2 if halves else 1, scale_dtype, bits)
    demote_pages(src_pages, src, dst, codes, scales, clip, group_size=gs, bits=bits)
    rows = src_pages[src.long()].flatten(0, 1)  # [3·PAGE, H, d] in destination order
    flat = (dst.long()[:, None] * PAGE + torch.arange(PAGE)).flatten()
    _check_written(codes, scales, flat, *int2_write_reference(rows, None, clip, gs, scale_dtype, bits))


@pytest.mark.parametrize("key_bits, k_clip, v_clip", [(2, 0.96, 0.0), (3, 0.0, 0.5), (2, 0.3, 0.9)])
def test_demote_kv_in_one_launch_bit_exact(seed, key_bits, k_clip, v_clip):
    # a ring overflow demotes K and V of the same pages; each side keeps its clip (both clip
    # algorithms: 0.96 / 0.9 walk down from the max, 0.3 / 0.5 bisect) and bit width
    h, d, n16, n2 = 2, 64, 6, 9
    kp, vp = ((torch.randn(n16, PAGE, h, d) * 2).to(torch.bfloat16) for _ in "kv")
    kp[0, 0, 0, :8] = 1.0  # ties at the top of a row
    src = torch.tensor([4, 0, 2], dtype=torch.int32)
    dst = torch.tensor([1, 8, 5], dtype=torch.int32)
    kc, ks = _pages(n2, h, d, 1, torch.float16, key_bits)
    vc, vs = _pages(n2, h, d, 1, torch.float16)
    demote_pages_kv(kp, vp, src, dst, kc, ks, vc, vs, k_clip, v_clip, key_bits=key_bits)
    flat = (dst.long()[:, None] * PAGE + torch.arange(PAGE)).flatten()
    for pages, c, s, clip, bits in ((kp, kc, ks, k_clip, key_bits), (vp, vc, vs, v_clip, 2)):
        rows = pages[src.long()].flatten(0, 1)
        _check_written(c, s, flat, *int2_write_reference(rows, None, clip, None, torch.float16, bits))
    with pytest.raises(ValueError, match="v_clip"):
        demote_pages_kv(kp, vp, src, dst, kc, ks, vc, vs, 0.9, 1.5, key_bits=key_bits)
    with pytest.raises(ValueError, match="v_scales"):
        demote_pages_kv(kp, vp, src, dst, kc, ks, vc, vs.float(), 0.9, 0.0, key_bits=key_bits)
    with pytest.raises(ValueError, match="give all three"):
        demote_pages_kv(kp, vp, src, dst, kc, ks, None, vs, 0.9, 0.0, key_bits=key_bits)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("halves", [False, True])
def test_three_bit_write_bit_exact(seed, d, scale_dtype, halves):
    # the 3-bit key layout: 7-step grid, low bits quartered, bit 2 in the trailing d/8-byte plane
    h, n, n_pages = 2, 37, 7
    gs = d // 2 if halves else None
    x = _special_rows(_dyadic(n, h, d))
    r = _rotation("per_head", h, d)
    pid, off, flat = _slots(n, n_pages)
    codes, scales = _pages(n_pages, h, d, 2 if halves else 1, scale_dtype, bits=3)
    int2_write(x, r, 0.9, pid, off, codes, scales, group_size=gs, bits=3)
    ref_c, ref_s = int2_write_reference(x, r, 0.9, gs, scale_dtype, bits=3)
    assert ref_c.shape[-1] == 3 * d // 8 and int((ref_c[..., d // 4:] != 0).sum()) > 0  # the plane is used
    _check_written(codes, scales, flat, ref_c, ref_s)


@pytest.mark.parametrize("key_bits, v_rot", [(2, "none"), (3, "per_head"), (2, "dense")])
@pytest.mark.parametrize("n, two_pass", [(19, False), (19, True), (70, None)])  # 70: default one-launch form
def test_kv_writes_in_one_launch_bit_exact(seed, key_bits, v_rot, n, two_pass):
    # the K and V rows of a step, each side with its own rotation, clip and bit width, in one launch
    # (or two: rotation first, when two_pass)
    h, d, n_pages = 2, 64, 12
    k, v = _special_rows(_dyadic(n, h, d)), _dyadic(n, h, d)
    rk, rv = _rotation("per_head", h, d), _rotation(v_rot, h, d)
    pid, off, flat = _slots(n, n_pages)
    kc, ks = _pages(n_pages, h, d, 1, torch.float16, bits=key_bits)
    vc, vs = _pages(n_pages, h, d, 1, torch.float16)
    int2_write_kv(k, v, rk, rv, 0.9, 0.0, pid, off, kc, ks, vc, vs, key_bits=key_bits, two_pass=two_pass)
    _check_written(kc, ks, flat, *int2_write_reference(k, rk, 0.9, None, torch.float16, bits=key_bits))
    _check_written(vc, vs, flat, *int2_write_reference(v, rv, 0.0, None, torch.float16))
    kp, vp = (torch.full((n_pages, PAGE, h, d), 3.0, dtype=torch.bfloat16) for _ in "kv")
    bf16_write_kv(k, v, rk, rv, pid, off, kp, vp)
    assert torch.equal(kp.flatten(0, 1)[flat], bf16_write_reference(k, rk))
    assert torch.equal(vp.flatten(0, 1)[flat], bf16_write_reference(v, rv))
    untouched = torch.ones(n_pages * PAGE, dtype=torch.bool)
    untouched[flat] = False
    assert bool((kp.flatten(0, 1)[untouched] == 3.0).all()) and bool((vp.flatten(0, 1)[untouched] == 3.0).all())


def test_kv_write_argument_errors():
    k = torch.randn(4, 2, 64)
    pid = torch.zeros(4, dtype=torch.int32)
    kc, ks = _pages(2, 2, 64, 1, torch.float16)
    vc, vs = _pages(2, 2, 64, 1, torch.float16)
    kp = torch.zeros(2, PAGE, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="v_pages"):
        bf16_write_kv(k, k, None, None, pid, pid, kp, None)
    with pytest.raises(ValueError, match="v_pages"):  # another layout than k_pages
        bf16_write_kv(k, k, None, None, pid, pid, kp, torch.zeros(2, 2, PAGE, 64, dtype=torch.bfloat16).transpose(1, 2))
    with pytest.raises(ValueError, match="^v "):
        bf16_write_kv(k, k[:2], None, None, pid, pid, kp, kp.clone())
    with pytest.raises(ValueError, match="v_codes"):
        int2_write_kv(k, k, None, None, 0.0, 0.0, pid, pid, kc, ks, None, vs)
    with pytest.raises(ValueError, match="v_scales"):
        int2_write_kv(k, k, None, None, 0.0, 0.0, pid, pid, kc, ks, vc, vs.float())
    with pytest.raises(ValueError, match="v_rotation"):
        int2_write_kv(k, k, None, torch.eye(32), 0.0, 0.0, pid, pid, kc, ks, vc, vs)
    with pytest.raises(ValueError, match="v_clip"):
        int2_write_kv(k, k, None, None, 0.0, 2.0, pid, pid, kc, ks, vc, vs)
    assert bool((kc == SENTINEL).all()) and bool((vc == SENTINEL).all())  # nothing written on a refusal


def test_write_argument_errors():
    x = torch.randn(4, 2, 64)
    pid = torch.zeros(4, dtype=torch.int32)
    codes, scales = _pages(2, 2, 64, 1, torch.float16)
    with pytest.raises(ValueError, match="page_ids"):
        int2_write(x, None, 0.0, pid.long(), pid, codes, scales)
    with pytest.raises(ValueError, match="scales"):
        int2_write(x, None, 0.0, pid, pid, codes, scales.to(torch.bfloat16))
    with pytest.raises(ValueError, match="rotation"):
        int2_write(x, torch.eye(32), 0.0, pid, pid, codes, scales)
    with pytest.raises(ValueError, match="clip_ratio"):
        int2_write(x, None, 1.5, pid, pid, codes, scales)
    with pytest.raises(ValueError, match="group_size"):
        int2_write(x, None, 0.0, pid, pid, codes, scales, group_size=48)
    with pytest.raises(ValueError, match="codes"):
        int2_write(x, None, 0.0, pid, pid, codes[..., :8], scales)
    with pytest.raises(ValueError, match="codes"):  # 3-bit rows need d/4 + d/8 bytes
        int2_write(x, None, 0.0, pid, pid, codes, scales, bits=3)
    with pytest.raises(ValueError, match="bits"):
        int2_write(x, None, 0.0, pid, pid, codes, scales, bits=4)


@pytest.mark.parametrize("two_pass", [False, True])
def test_head_major_pages_write_and_demote(seed, two_pass):
    # the writers address codes and (s, z) through their strides: a head-major store gets the same
    # logical values
    h, d, n_pages, n = 3, 64, 10, 29
    k, v = _special_rows(_dyadic(n, h, d)), _dyadic(n, h, d)
    rk = _rotation("per_head", h, d)
    pid, off, flat = _slots(n, n_pages)
    kc, ks = _pages(n_pages, h, d, 1, torch.float16, head_major=True)
    vc, vs = _pages(n_pages, h, d, 1, torch.float16, head_major=True)
    assert ks.stride()[1:3] == (2, 2 * PAGE) and kc.stride()[1:3] == (d // 4, d // 4 * PAGE)
    int2_write_kv(k, v, rk, None, 0.9, 0.5, pid, off, kc, ks, vc, vs, two_pass=two_pass)
    _check_written(kc, ks, flat, *int2_write_reference(k, rk, 0.9, None, torch.float16))
    _check_written(vc, vs, flat, *int2_write_reference(v, None, 0.5, None, torch.float16))
    kp, vp = ((torch.randn(6, PAGE, h, d) * 2).to(torch.bfloat16) for _ in "kv")
    src, dst = torch.tensor([4, 0], dtype=torch.int32), torch.tensor([1, 7], dtype=torch.int32)
    kc, ks = _pages(9, h, d, 1, torch.float16, head_major=True)
    vc, vs = _pages(9, h, d, 1, torch.float16, head_major=True)
    demote_pages_kv(kp, vp, src, dst, kc, ks, vc, vs, 0.96, 0.0)
    flat = (dst.long()[:, None] * PAGE + torch.arange(PAGE)).flatten()
    for pages, c, sc, clip in ((kp, kc, ks, 0.96), (vp, vc, vs, 0.0)):
        _check_written(c, sc, flat, *int2_write_reference(pages[src.long()].flatten(0, 1), None, clip, None,
                                                          torch.float16))


@pytest.mark.parametrize("two_pass, per_head, with_v, scale_dtype", [
    (True, True, True, torch.float16), (False, False, True, torch.float32), (True, False, False, torch.float16),
    (None, None, True, torch.float16)])
def test_int2_write_kv_bf16_copy_equals_bf16_write_kv(seed, two_pass, per_head, with_v, scale_dtype):
    # bf16_copy: the INT2 launch also stores the rotated rows BF16, bit-equal to bf16_write_kv
    # (per_head None: no rotation at all); the INT2 pages equal the write without it
    from oscar_ray.kernels import bf16_write_kv

    gen = torch.Generator().manual_seed(seed)
    n, h, d, page = 5, 2, 64, 8
    rot = None if per_head is None else torch.linalg.qr(torch.randn(*((h, d, d) if per_head else (d, d)),
                                                                     dtype=torch.float64, generator=gen))[0].float()
    k = torch.randn(n, h, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, h, d, generator=gen).to(torch.bfloat16) if with_v else None
    slots = torch.randperm(6 * page, generator=gen)[:n].int()
    pages, offs = slots // page, slots % page
    b_slots = torch.randperm(4 * page, generator=gen)[:n].int()
    b_pages, b_offs = b_slots // page, b_slots % page

    def int2_pages():
        return [torch.zeros(6, page, h, d // 4, dtype=torch.uint8), torch.zeros(6, page, h, 2, dtype=scale_dtype)]

    kc, ks = int2_pages()
    vc, vs = int2_pages() if with_v else (None, None)
    kb = torch.full((4, page, h, d), 7.0, dtype=torch.bfloat16)
    vb = kb.clone() if with_v else None
    int2_write_kv(k, v, rot, rot if with_v else None, 0.9, 0.0, pages, offs, kc, ks, vc, vs, two_pass=two_pass,
                  bf16_copy=(b_pages, b_offs, kb, vb))
    want = [t.clone() if t is not None else None for t in (kc, ks, vc, vs)]
    for t in want:
        if t is not None:
            t.zero_()
    int2_write_kv(k, v, rot, rot if with_v else None, 0.9, 0.0, pages, offs, *want, two_pass=two_pass)
    for got, exp in zip((kc, ks, vc, vs), want):
        assert got is None or torch.equal(got, exp)
    wkb = torch.full_like(kb, 7.0)
    wvb = torch.full_like(kb, 7.0) if with_v else None
    bf16_write_kv(k, v, rot, rot if with_v else None, b_pages, b_offs, wkb, wvb)
    assert torch.equal(kb, wkb) and (vb is None or torch.equal(vb, wvb))
    assert not torch.equal(kb, torch.full_like(kb, 7.0))  # written
    with pytest.raises(ValueError, match="bf16_copy v_pages"):
        int2_write_kv(k, v, rot, None, 0.9, 0.0, pages, offs, kc, ks, vc, vs,
                      bf16_copy=(b_pages, b_offs, kb, None if with_v else kb))
    with pytest.raises(ValueError, match="bf16_copy offsets"):
        int2_write_kv(k, v, rot, None, 0.9, 0.0, pages, offs, kc, ks, vc, vs, bf16_copy=(b_pages, b_offs[:2], kb, vb))
