import pytest
import torch

from oscar_ray.quant import QueryMoment, ValueTargetDiag, ValueTargetSoftmax


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b))


def _qkv(t, hq, hkv, d):
    return (torch.randn(t, hq, d, dtype=torch.float64), torch.randn(t, hkv, d, dtype=torch.float64),
            torch.randn(t, hkv, d, dtype=torch.float64))


@pytest.mark.parametrize("hq,hkv", [(9, 3), (32, 8), (4, 4)])
def test_query_moment_groups_heads_contiguously(seed, hq, hkv):
    d, g = 16, hq // hkv
    q, _, _ = _qkv(50, hq, hkv, d)
    m = QueryMoment(hkv, d, n_q_heads=hq)
    m.update(q)
    for h in range(hkv):
        qh = q[:, h * g : (h + 1) * g].reshape(-1, d)  # authors' grouping: heads [h·g, (h+1)·g)
        assert torch.allclose(m.per_head()[h], qh.T @ qh / qh.shape[0], rtol=1e-12, atol=1e-14)
    expected = sum(m.per_head()[h] for h in range(hkv)) / hkv
    assert torch.allclose(m.layer(), expected, rtol=1e-12, atol=1e-14)
    assert m.rows == 50 * g


def test_streaming_equals_batch_and_merge_equals_single_pass(seed):
    q, k, v = _qkv(300, 9, 3, 32)
    whole = QueryMoment(3, 32, n_q_heads=9)
    whole.update(q)
    chunks = [QueryMoment(3, 32, n_q_heads=9) for _ in range(3)]
    streamed = QueryMoment(3, 32, n_q_heads=9)
    for i, part in enumerate(torch.split(q, [70, 130, 100])):
        chunks[i].update(part)
        streamed.update(part)
    merged = chunks[0].merge(chunks[1]).merge(chunks[2])
    for acc in (streamed, merged):
        assert _rel(acc.layer(), whole.layer()) < 1e-12
        assert acc.rows == whole.rows

    c_q = whole.per_head()
    diag_whole = ValueTargetDiag(3, 32, c_q=c_q)
    diag_whole.update(k, v)
    parts = [ValueTargetDiag(3, 32, c_q=c_q) for _ in range(2)]
    parts[0].update(k[:120], v[:120])
    parts[1].update(k[120:], v[120:])
    assert _rel(parts[0].merge(parts[1]).layer(), diag_whole.layer()) < 1e-12


def test_value_target_diag_matches_authors_formula(seed):
    q, k, v = _qkv(80, 9, 3, 16)
    m = QueryMoment(3, 16, n_q_heads=9)
    m.update(q)
    acc = ValueTargetDiag(3, 16, c_q=m.per_head())
    acc.update(k, v)
    expected = torch.zeros(16, 16, dtype=torch.float64)
    for h in range(3):
        qg = q[:, h * 3 : (h + 1) * 3].reshape(-1, 16)
        qtq = qg.T @ qg / qg.shape[0]
        w = (k[:, h] @ qtq * k[:, h]).sum(1)
        w = w / w.sum() * 80  # rescale to mean 1
        vw = v[:, h] * w.sqrt()[:, None]
        expected += vw.T @ vw / 80
    expected /= 3
    assert torch.allclose(acc.layer(), (expected + expected.T) / 2, rtol=1e-11, atol=1e-14)


def test_value_target_softmax_matches_dense_formula(seed):
    t, hq, hkv, d = 40, 6, 2, 8
    q, k, v = _qkv(t, hq, hkv, d)
    acc = ValueTargetSoftmax(hkv, d, n_q_heads=hq, chunk_size=7)  # odd chunk: exercises the chunk loop
    acc.update(q, k, v)
    g = hq // hkv
    mask = torch.ones(t, t).tril().bool()
    for h in range(hkv):
        total = torch.zeros(d, d, dtype=torch.float64)
        for j in range(g):
            s = (q[:, h * g + j] @ k[:, h].T / d**0.5).masked_fill(~mask, float("-inf")).softmax(-1)
            sv = s @ v[:, h]
            total += sv.T @ sv  # VᵀSᵀSV
        assert torch.allclose(acc.per_head()[h], total / (t * g), rtol=1e-11, atol=1e-14)


def test_value_target_softmax_chunked_prefill_equals_full(seed):
    q, k, v = _qkv(30, 4, 2, 8)
    full = ValueTargetSoftmax(2, 8, n_q_heads=4)
    full.update(q, k, v)
    a, b = ValueTargetSoftmax(2, 8, n_q_heads=4), ValueTargetSoftmax(2, 8, n_q_heads=4)
    a.update(q[:12], k[:12], v[:12])
    b.update(q[12:], k, v)  # a chunk appended after a 12-token prefix
    assert _rel(a.merge(b).layer(), full.layer()) < 1e-12


def test_bad_shapes_raise():
    m = QueryMoment(3, 16, n_q_heads=9)
    with pytest.raises(ValueError, match=r"q must be \[T, 9, 16\]"):
        m.update(torch.randn(4, 8, 16))
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        QueryMoment(3, 16, n_q_heads=8)
    with pytest.raises(ValueError, match="no data"):
        m.layer()
    with pytest.raises(ValueError, match="c_q must be"):
        ValueTargetDiag(3, 16, c_q=torch.zeros(2, 16, 16))
    with pytest.raises(ValueError, match="cannot merge"):
        m.merge(QueryMoment(3, 32, n_q_heads=9))
