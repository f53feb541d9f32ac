"""rotate_qk against reference.rotate_heads (fp32 rounding), every GQA grouping and rotation shape."""

import pytest
import torch

from oscar_ray.kernels.reference import rotate_heads
from oscar_ray.kernels.rotate import rotate_qk


def _orthogonal(*shape, gen):
    return torch.linalg.qr(torch.randn(*shape, dtype=torch.float64, generator=gen))[0].float()


@pytest.mark.parametrize("n, hkv, g, d, per_head, dtype", [
    (1, 8, 4, 128, True, torch.bfloat16), (19, 2, 3, 64, True, torch.float32), (5, 4, 1, 64, False, torch.float16),
    (33, 1, 12, 128, False, torch.bfloat16)])
def test_rotate_qk_equals_rotate_heads(seed, n, hkv, g, d, per_head, dtype):
    gen = torch.Generator().manual_seed(seed)
    r = _orthogonal(hkv, d, d, gen=gen) if per_head else _orthogonal(d, d, gen=gen)
    q = torch.randn(n, hkv * g, d, generator=gen).to(dtype)
    k = torch.randn(n, hkv, d, generator=gen).to(dtype)
    q_rot, k_rot = rotate_qk(q, r, k)
    assert q_rot.dtype == k_rot.dtype == torch.float32
    torch.testing.assert_close(q_rot, rotate_heads(q, r), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot, rotate_heads(k, r), atol=2e-5, rtol=1e-5)
    q_only, none = rotate_qk(q, r, n_kv_heads=hkv)
    assert none is None and torch.equal(q_only, q_rot)


def test_rotate_qk_strided_rows_and_errors(seed):
    gen = torch.Generator().manual_seed(seed)
    r = _orthogonal(2, 64, 64, gen=gen)
    qkv = torch.randn(3, 8 + 2 + 2, 64, generator=gen)  # q and k as views of one fused projection
    q, k = qkv[:, :8], qkv[:, 8:10]
    q_rot, k_rot = rotate_qk(q, r, k)
    torch.testing.assert_close(q_rot, rotate_heads(q, r), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot, rotate_heads(k, r), atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rotation must be"):
        rotate_qk(q, r[:, :32, :32], k)
    with pytest.raises(ValueError, match="not a multiple"):
        rotate_qk(q[:, :7], r, k)
    with pytest.raises(ValueError, match="rotation is required"):
        rotate_qk(q, None)
    with pytest.raises(ValueError, match="k has size"):
        rotate_qk(q, r, k[:2])
    assert rotate_qk(q[:0], r, k[:0])[0].shape == (0, 8, 64)


@pytest.mark.parametrize("per_head, with_v, v_rot", [(True, True, False), (False, True, True), (True, False, False)])
def test_rotate_qk_store_writes_what_bf16_write_kv_writes(seed, per_head, with_v, v_rot):
    # the step's new rows stored BF16 by the q-rotation launch: the same slots, the same bits as
    # bf16_write_kv, and nothing else in the pages changes; q's rotation is unchanged by it
    from oscar_ray.kernels import bf16_write_kv
    from oscar_ray.kernels.rotate import NewRows

    gen = torch.Generator().manual_seed(seed)
    hkv, g, d, n, pages, page = 2, 4, 64, 3, 5, 8
    r = _orthogonal(hkv, d, d, gen=gen) if per_head else _orthogonal(d, d, gen=gen)
    rv = _orthogonal(hkv, d, d, gen=gen) if v_rot else None
    q = torch.randn(n, hkv * g, d, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(n, hkv, d, generator=gen).to(torch.bfloat16) for _ in "kv")
    ids = torch.tensor([4, 0, 2], dtype=torch.int32)
    offs = torch.tensor([7, 3, 0], dtype=torch.int32)
    kp, vp = (torch.randn(pages, page, hkv, d, generator=gen).to(torch.bfloat16) for _ in "kv")
    want_k, want_v = kp.clone(), vp.clone()
    bf16_write_kv(k, v if with_v else None, r, rv, ids, offs, want_k, want_v if with_v else None)
    store = NewRows(k, v if with_v else None, rv, ids, offs, kp, vp if with_v else None)
    q_rot, none = rotate_qk(q, r, n_kv_heads=hkv, store=store)
    assert none is None and torch.equal(q_rot, rotate_qk(q, r, n_kv_heads=hkv)[0])
    assert torch.equal(kp, want_k) and torch.equal(vp, want_v)
    assert not torch.equal(want_k, kp.new_zeros(kp.shape))
    # rows without queries (a call whose q rows are fewer) and errors before any write
    rotate_qk(q[:0], r, n_kv_heads=hkv, store=store)
    assert torch.equal(kp, want_k)
    kept = kp.clone()
    with pytest.raises(ValueError, match="store must be"):
        rotate_qk(q, r, n_kv_heads=hkv, store=(k, v))
    with pytest.raises(ValueError, match="store.v and store.v_pages"):
        rotate_qk(q, r, n_kv_heads=hkv, store=store._replace(v=None, v_pages=vp))
    with pytest.raises(ValueError, match="offsets"):
        rotate_qk(q, r, n_kv_heads=hkv, store=store._replace(offsets=offs[:2]))
    with pytest.raises(ValueError, match="block_rows must be 16"):
        rotate_qk(q, r, n_kv_heads=hkv, store=store, block_rows=32)
    assert torch.equal(kp, kept)
