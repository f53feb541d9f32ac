"""Next-token choice for a batch of rows: greedy rows in one argmax, sampled rows one by one with
each request's own torch.Generator (a seed reproduces a request whatever else is in the batch)."""

from __future__ import annotations

import random

import torch

from oscar_ray.engines.base import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**63)
    return torch.Generator().manual_seed(seed)


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] → probabilities [V] after temperature, top-k (0 = off) and nucleus top-p."""
    x = logits.to(torch.float32) / temperature
    if 0 < top_k < x.numel():
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least the top token)
        drop = (torch.cumsum(sorted_p, 0) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        probs = probs / probs.sum()
    return probs


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """logits [R, V] (any device) → one token id per row."""
    logits = logits.float().cpu()
    out = logits.argmax(dim=-1).tolist()
    for r, (p, g) in enumerate(zip(params, generators)):
        if not p.greedy:
            probs = filter_logits(logits[r], p.temperature, p.top_k, p.top_p)
            out[r] = int(torch.multinomial(probs, 1, generator=g))
    return out
