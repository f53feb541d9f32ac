"""Rotations per TP rank: KV heads split the way sglang's QKVParallelLinear splits them (no sglang)."""

import pytest
import torch

from oscar_ray.engines.sglang import kv_heads_of_rank, rank_rotations, shard_rotation
from oscar_ray.quant.artifact import RotationSet


def _orthogonal(*shape):
    q, _ = torch.linalg.qr(torch.randn(*shape, dtype=torch.float64))
    return q.float()


@pytest.mark.parametrize("n_kv, tp, expect", [
    (8, 1, [range(0, 8)]),
    (8, 2, [range(0, 4), range(4, 8)]),
    (8, 8, [range(i, i + 1) for i in range(8)]),
    (2, 4, [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]),  # replicas: rank r holds head r // (tp/h)
    (3, 3, [range(0, 1), range(1, 2), range(2, 3)]),
])
def test_kv_heads_of_rank(n_kv, tp, expect):
    assert [kv_heads_of_rank(n_kv, r, tp) for r in range(tp)] == expect


@pytest.mark.parametrize("n_kv, tp, rank", [(8, 3, 0), (3, 4, 0), (8, 2, 2), (8, 2, -1)])
def test_kv_heads_of_rank_rejects(n_kv, tp, rank):
    with pytest.raises(ValueError):
        kv_heads_of_rank(n_kv, rank, tp)


def test_per_head_rotations_concatenate_back(seed):
    r = _orthogonal(5, 8, 16, 16)
    parts = [shard_rotation(r, 8, rank, 4) for rank in range(4)]
    assert all(p.shape == (5, 2, 16, 16) for p in parts)
    assert torch.equal(torch.cat(parts, dim=1), r)
    shared = _orthogonal(5, 16, 16)
    assert shard_rotation(shared, 8, 3, 4) is shared  # one rotation per layer: every rank uses it


def _artifact(tmp_path, per_head: bool):
    shape = (4, 2, 16, 16) if per_head else (4, 16, 16)
    rs = RotationSet(k_rotation=_orthogonal(*shape), v_rotation=_orthogonal(*shape),
                     k_eigenvalues=torch.rand(shape[:-1]), v_eigenvalues=torch.rand(shape[:-1]),
                     k_clip=torch.tensor([0.9, 0.91, 0.92, 0.93]), v_clip=torch.tensor([0.8, 0.81, 0.82, 0.83]),
                     manifest={"n_kv_heads": 2})
    rs.save(tmp_path / "rot")
    return RotationSet.load(tmp_path / "rot")


def test_rank_rotations_from_artifact(tmp_path, seed):
    rs = _artifact(tmp_path, per_head=True)
    # pipeline stage holding layers 1..2, tp 2 of a 2-KV-head model: rank 1 holds head 1
    rr = rank_rotations(rs, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=1, tp_size=2, start_layer=1, end_layer=3)
    r_k, r_v, kc, vc = rr.layer(2)
    assert torch.equal(r_k, rs.k_rotation[2, 1:2]) and torch.equal(r_v, rs.v_rotation[2, 1:2])
    assert (kc, vc) == pytest.approx((0.92, 0.82))
    with pytest.raises(ValueError, match="layer 3 is not on this rank"):
        rr.layer(3)
    # tp 4 > 2 heads: ranks 2 and 3 replicate head 1
    r4 = rank_rotations(rs, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=3, tp_size=4, k_clip=0.5)
    assert torch.equal(r4.layer(0)[0], rs.k_rotation[0, 1:2]) and r4.layer(0)[2] == 0.5


def test_rank_rotations_shared_and_identity(tmp_path, seed):
    rs = _artifact(tmp_path, per_head=False)
    rr = rank_rotations(rs, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=0, tp_size=2)
    assert torch.equal(rr.layer(3)[0], rs.k_rotation[3])
    ident = rank_rotations(None, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=0, tp_size=2)
    assert ident.layer(0) == (None, None, 0.96, 0.92)
    with pytest.raises(ValueError, match="n_layers is 4 but the model has 6"):
        rank_rotations(rs, n_layers=6, n_kv_heads=2, head_dim=16, tp_rank=0, tp_size=1)


def test_rank_rotations_cut_the_means_like_the_heads(tmp_path, seed):
    base = _artifact(tmp_path, per_head=False)
    rs = RotationSet(base.k_rotation, base.v_rotation, base.k_eigenvalues, base.v_eigenvalues, base.k_clip,
                     base.v_clip, manifest={"n_kv_heads": 2}, k_mean=torch.randn(4, 2, 16), v_mean=torch.randn(4, 2, 16))
    rr = rank_rotations(rs, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=1, tp_size=2, start_layer=1, end_layer=3)
    mu_k, mu_v = rr.means(2, absorbed_v=False)
    assert torch.equal(mu_k, rs.k_mean[2, 1:2]) and torch.equal(mu_v, rs.v_mean[2, 1:2])
    _, mu_v_rot = rr.means(2, absorbed_v=True)  # the basis an absorbed W_v produces: μ_V·R_V
    torch.testing.assert_close(mu_v_rot, rs.v_mean[2, 1:2] @ rs.v_rotation[2], rtol=1e-5, atol=1e-5)
    # tp 4 > 2 heads: rank 2 replicates head 1
    r4 = rank_rotations(rs, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=2, tp_size=4)
    assert torch.equal(r4.to("cpu").means(0, False)[0], rs.k_mean[0, 1:2])
    assert rank_rotations(base, n_layers=4, n_kv_heads=2, head_dim=16, tp_rank=0, tp_size=2).means(0, True) is None
