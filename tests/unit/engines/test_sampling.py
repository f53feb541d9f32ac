"""Sampling filters and per-request generators."""

import torch

from oscar_ray.engines.base import SamplingParams
from oscar_ray.engines.torch.sampling import filter_logits, make_generator, sample


def test_top_k_keeps_exactly_k():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.0, 3.0])
    p = filter_logits(logits, 1.0, 2, 1.0)
    assert set(torch.nonzero(p).flatten().tolist()) == {1, 3}
    assert abs(float(p.sum()) - 1) < 1e-6


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = filter_logits(probs.log(), 1.0, 0, 0.8)  # 0.5 + 0.3 reaches 0.8: two tokens
    assert torch.nonzero(p).flatten().tolist() == [0, 1]
    assert torch.allclose(p[:2], torch.tensor([0.625, 0.375]))
    assert torch.nonzero(filter_logits(probs.log(), 1.0, 0, 0.1)).flatten().tolist() == [0]  # top token always


def test_low_temperature_sharpens():
    logits = torch.tensor([1.0, 2.0])
    assert filter_logits(logits, 0.1, 0, 1.0)[1] > filter_logits(logits, 1.0, 0, 1.0)[1]


def test_seed_reproduces_and_greedy_is_argmax(seed):
    logits = torch.randn(3, 50)
    sp = SamplingParams(temperature=1.0, seed=seed)
    a = sample(logits, [sp] * 3, [make_generator(sp) for _ in range(3)])
    b = sample(logits, [sp] * 3, [make_generator(sp) for _ in range(3)])
    assert a == b
    greedy = SamplingParams(temperature=0.0)
    assert make_generator(greedy) is None
    assert sample(logits, [greedy] * 3, [None] * 3) == logits.argmax(-1).tolist()


def test_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, 0.0, float("-inf"), 2.0]])
    sp = SamplingParams(temperature=1.0, seed=7)
    g = make_generator(sp)
    draws = [sample(logits, [sp], [g])[0] for _ in range(400)]
    assert 2 not in draws
    assert draws.count(3) > draws.count(0) * 3  # p(3)/p(0) = e² ≈ 7.4
