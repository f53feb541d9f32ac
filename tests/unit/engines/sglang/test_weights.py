"""R_V folded into sglang-shaped fused qkv / o shards leaves attention's output unchanged (no sglang)."""

import pytest
import torch

from oscar_ray.engines.sglang import kv_heads_of_rank, shard_rotation
from oscar_ray.engines.sglang.weights import fold_value_rotation_


def _orthogonal(*shape):
    q, _ = torch.linalg.qr(torch.randn(*shape, dtype=torch.float64))
    return q


def _attention(x, w_qkv, b_qkv, w_o, hq, hkv, d):
    """x [T, hidden] → causal GQA attention through a fused qkv ([q | k | v] rows) and o_proj."""
    t = x.shape[0]
    qkv = x @ w_qkv.T + (0 if b_qkv is None else b_qkv)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    q, k, v = (z.reshape(t, -1, d).transpose(0, 1) for z in (q, k, v))
    g = hq // hkv
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    s = (q @ k.transpose(1, 2)) / d**0.5
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(0, 1).reshape(t, hq * d)
    return o @ w_o.T


@pytest.mark.parametrize("hq, hkv, per_head, bias", [(4, 2, True, True), (6, 3, False, False), (4, 4, True, False)])
def test_fold_keeps_output(seed, hq, hkv, per_head, bias):
    d, hidden, t = 8, 24, 7
    w_qkv = torch.randn((hq + 2 * hkv) * d, hidden, dtype=torch.float64)
    b_qkv = torch.randn((hq + 2 * hkv) * d, dtype=torch.float64) if bias else None
    w_o = torch.randn(hidden, hq * d, dtype=torch.float64)
    x = torch.randn(t, hidden, dtype=torch.float64)
    r = _orthogonal(hkv, d, d) if per_head else _orthogonal(d, d)
    ref = _attention(x, w_qkv, b_qkv, w_o, hq, hkv, d)
    w2, b2, o2 = w_qkv.clone(), None if b_qkv is None else b_qkv.clone(), w_o.clone()
    fold_value_rotation_(w2, b2, o2, r, hq, hkv, d)
    assert not torch.allclose(w2, w_qkv)  # the V rows did change
    assert torch.equal(w2[: (hq + hkv) * d], w_qkv[: (hq + hkv) * d])  # q and k rows did not
    torch.testing.assert_close(_attention(x, w2, b2, o2, hq, hkv, d), ref, atol=1e-9, rtol=0)


def test_fold_per_tp_shard_matches_unsharded(seed):
    """tp=2 shards of a 4-q / 2-kv-head layer, each folded with its rank's per-head rotations: the
    summed row-parallel outputs equal the unfolded, unsharded layer."""
    hq, hkv, d, hidden, t, tp = 4, 2, 8, 16, 5, 2
    w_q, w_k, w_v = (torch.randn(h * d, hidden, dtype=torch.float64) for h in (hq, hkv, hkv))
    w_o = torch.randn(hidden, hq * d, dtype=torch.float64)
    x = torch.randn(t, hidden, dtype=torch.float64)
    r_all = _orthogonal(1, hkv, d, d)  # [L=1, H_kv, d, d]
    ref = _attention(x, torch.cat([w_q, w_k, w_v]), None, w_o, hq, hkv, d)
    total = torch.zeros_like(ref)
    for rank in range(tp):
        heads = kv_heads_of_rank(hkv, rank, tp)
        qs = slice(rank * hq // tp * d, (rank + 1) * hq // tp * d)
        ks = slice(heads.start * d, heads.stop * d)
        shard = torch.cat([w_q[qs], w_k[ks], w_v[ks]])
        o_shard = w_o[:, qs].clone()
        fold_value_rotation_(shard, None, o_shard, shard_rotation(r_all, hkv, rank, tp)[0], hq // tp, len(heads), d)
        total += _attention(x, shard, None, o_shard, hq // tp, len(heads), d)
    torch.testing.assert_close(total, ref, atol=1e-9, rtol=0)


def test_fold_rejects_wrong_shapes():
    w = torch.zeros(4 * 8, 16)
    with pytest.raises(ValueError, match="qkv_proj has 32 rows"):
        fold_value_rotation_(w, None, torch.zeros(16, 16), torch.eye(8), 2, 2, 8)
    with pytest.raises(ValueError, match="R_V must be"):
        fold_value_rotation_(torch.zeros(6 * 8, 16), None, torch.zeros(16, 16), torch.eye(8).expand(3, 8, 8), 2, 2, 8)
