"""Tensor-parallel OSCAR attention: KV heads split across ranks, each rank with its own paged pools.

Rank r of tp holds the KV heads `kv_heads_of_rank(H_kv, r, tp)` (sglang's split, engines/sglang/
sharding.py: contiguous blocks, or for tp > H_kv one head replicated on tp/H_kv ranks) and the
query heads [r·Hq/tp, (r+1)·Hq/tp), which are exactly the query heads of those KV heads.  q/k/v
projections are column-parallel by heads, o_proj row-parallel; the partial outputs are summed by an
all-reduce.  Attention never crosses heads, so each rank's share is the single-rank computation on
a subset of heads, with the per-rank slice of the rotations (`shard_rotation`: a per-layer [L, d, d]
rotation is shared by every rank, a per-head [L, H_kv, d, d] one is cut like the heads).

Pages: requests and their lengths are the same on every rank, so every rank makes the same
allocator calls and gets the same page ids; its KVStore holds only its heads (1/tp of the bytes
for tp <= H_kv).  The per-layer work is the torch engine's `StepBatch.attend` (write the new K/V
into INT2 / BF16 slots, attend over the paged prefix), so the TP path runs the same kernels.

Example (one process per rank, torch.distributed already initialised):
    stack = TPAttentionStack(shape, weights, rank, tp, n_int2_pages=4096, n_bf16_pages=64,
                             k_rotation=r_k, v_rotation=r_v, device="cuda")
    stack.allocator.allocate("a", 1000); b = stack.batch([("a", 0, 1000)]); y = stack.forward(x, b)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oscar_ray import _defaults as D
from oscar_ray.cache import KVAllocator, PageGeometry
from oscar_ray.kernels.reference import rotate_heads

from .sglang.sharding import kv_heads_of_rank, shard_rotation
from .torch.batch import StepBatch, StepItem
from .torch.kvstore import KVStore


@dataclass(frozen=True)
class AttentionShape:
    """Global (unsharded) attention shape of one model."""

    hidden: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    qk_norm: bool = True
    rope_theta: float = 1e6
    eps: float = 1e-6


def q_heads_of_rank(n_q_heads: int, n_kv_heads: int, tp_rank: int, tp_size: int) -> range:
    """Query heads of `tp_rank`: the query heads of its KV heads (ValueError when tp does not divide Hq)."""
    kv = kv_heads_of_rank(n_kv_heads, tp_rank, tp_size)
    if n_q_heads % n_kv_heads or n_q_heads % tp_size:
        raise ValueError(f"n_q_heads={n_q_heads} must be divisible by n_kv_heads={n_kv_heads} and tp_size={tp_size}")
    per = n_q_heads // tp_size
    heads = range(tp_rank * per, (tp_rank + 1) * per)
    g = n_q_heads // n_kv_heads
    assert heads.start // g >= kv.start and (heads.stop - 1) // g < kv.stop  # GQA groups stay on one rank
    return heads


@dataclass
class AttentionWeights:
    """One layer: wq [Hq·d, hidden], wk / wv [H_kv·d, hidden], wo [hidden, Hq·d], q/k norm weights [d]."""

    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None

    @staticmethod
    def random(shape: AttentionShape, generator: torch.Generator, dtype=torch.float32, device="cpu"):
        h, d = shape.hidden, shape.head_dim
        mk = lambda rows, cols: (torch.randn(rows, cols, generator=generator) / cols**0.5).to(device, dtype)  # noqa: E731
        norm = (lambda: (1 + 0.1 * torch.randn(d, generator=generator)).to(device, dtype)) if shape.qk_norm else None
        return AttentionWeights(mk(shape.n_q_heads * d, h), mk(shape.n_kv_heads * d, h), mk(shape.n_kv_heads * d, h),
                                mk(h, shape.n_q_heads * d), norm() if norm else None, norm() if norm else None)

    @staticmethod
    def random_shard(shape: AttentionShape, tp_rank: int, tp_size: int, generator: torch.Generator,
                     dtype=torch.bfloat16, device="cpu") -> "AttentionWeights":
        """Only this rank's slices, drawn like `random` (a GLM-4.7-sized layer is 136M parameters:
        a one-rank benchmark need not build all 92 of them)."""
        d, h = shape.head_dim, shape.hidden
        nq = len(q_heads_of_rank(shape.n_q_heads, shape.n_kv_heads, tp_rank, tp_size)) * d
        nk = len(kv_heads_of_rank(shape.n_kv_heads, tp_rank, tp_size)) * d
        rnd = lambda *size: torch.randn(*size, generator=generator, device=device, dtype=dtype)  # noqa: E731
        mk = lambda rows, cols, fan: rnd(rows, cols) / fan**0.5  # noqa: E731
        norm = (lambda: 1 + 0.1 * rnd(d)) if shape.qk_norm else (lambda: None)
        return AttentionWeights(mk(nq, h, h), mk(nk, h, h), mk(nk, h, h), mk(h, nq, shape.n_q_heads * d), norm(), norm())

    def shard(self, shape: AttentionShape, tp_rank: int, tp_size: int) -> "AttentionWeights":
        """This rank's rows of wq / wk / wv and columns of wo."""
        d = shape.head_dim
        qh = q_heads_of_rank(shape.n_q_heads, shape.n_kv_heads, tp_rank, tp_size)
        kh = kv_heads_of_rank(shape.n_kv_heads, tp_rank, tp_size)
        rows = lambda r: slice(r.start * d, r.stop * d)  # noqa: E731
        return AttentionWeights(self.wq[rows(qh)].contiguous(), self.wk[rows(kh)].contiguous(),
                                self.wv[rows(kh)].contiguous(), self.wo[:, rows(qh)].contiguous(),
                                self.q_norm, self.k_norm)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE (Llama / Qwen3 layout) of x [N, H, d] at positions [N]."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None]  # [N, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    xf = x.float()
    half = torch.cat([-xf[..., d // 2:], xf[..., :d // 2]], -1)
    return (xf * cos + half * sin).to(x.dtype)


class TPAttentionStack:
    """One rank's share of L attention layers over its own OSCAR (or all-BF16) paged pools."""

    def __init__(self, shape: AttentionShape, weights: list[AttentionWeights], tp_rank: int, tp_size: int, *,
                 n_int2_pages: int, n_bf16_pages: int, k_rotation: torch.Tensor | None = None,
                 v_rotation: torch.Tensor | None = None, k_clip: float = D.K_CLIP_RATIO,
                 v_clip: float = D.V_CLIP_RATIO, kv_cache: str = "oscar", page_size: int = D.PAGE_SIZE,
                 sink_tokens: int = D.SINK_TOKENS, recent_tokens: int = D.RECENT_TOKENS, max_len: int = 1 << 17,
                 group=None, device="cpu", use_kernels: bool | None = None, sharded: bool = False,
                 reduce: bool = True) -> None:
        """`sharded`: `weights` are already this rank's slices (AttentionWeights.random_shard).
        `reduce` False skips the all-reduce (one rank's share timed alone, no process group)."""
        if kv_cache not in ("oscar", "bf16"):
            raise ValueError(f"kv_cache must be 'oscar' or 'bf16', got {kv_cache!r}")
        self.shape, self.rank, self.tp, self.group = shape, tp_rank, tp_size, group
        self.n_layers = len(weights)
        self.kv_heads = kv_heads_of_rank(shape.n_kv_heads, tp_rank, tp_size)
        self.q_heads = q_heads_of_rank(shape.n_q_heads, shape.n_kv_heads, tp_rank, tp_size)
        self.weights = list(weights) if sharded else [w.shard(shape, tp_rank, tp_size) for w in weights]
        self.reduce = reduce and tp_size > 1
        dev = torch.device(device)
        cut = lambda r: None if r is None else shard_rotation(r, shape.n_kv_heads, tp_rank, tp_size).to(dev, torch.float32)  # noqa: E731
        oscar = kv_cache == "oscar"
        self.k_rotation = cut(k_rotation) if oscar else None
        self.v_rotation = cut(v_rotation) if oscar else None
        if not oscar:  # every page BF16: a recent window longer than any sequence
            sink_tokens, recent_tokens, n_int2_pages = 0, -(-max_len // page_size) * page_size, 0
        g = PageGeometry(self.n_layers, len(self.kv_heads), shape.head_dim, page_size, sink_tokens=sink_tokens,
                         recent_tokens=recent_tokens)
        self.geometry = g
        self.allocator = KVAllocator(g, n_int2_pages, n_bf16_pages)
        clips = (torch.full((self.n_layers,), k_clip if oscar else 0.0), torch.full((self.n_layers,), v_clip if oscar else 0.0))
        self.store = KVStore(g, n_int2_pages, n_bf16_pages, dev, "float16", *clips)
        if use_kernels is not None:  # the Triton path on CPU tensors (TRITON_INTERPRET=1), for tests
            self.store.cpu = not use_kernels

    def batch(self, items: list[tuple[object, int, int]]) -> StepBatch:
        """(request key, first new position, new tokens) of each request of this step → its StepBatch."""
        steps = [StepItem(key, self.allocator.segments(key), start, n) for key, start, n in items]
        return StepBatch(self.store, steps, self.k_rotation)

    def attention(self, layer: int, x: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """x [N, hidden] → this layer's attention output [N, hidden], summed over the ranks."""
        w, s, d = self.weights[layer], self.shape, self.shape.head_dim
        n = x.shape[0]
        q = (x @ w.wq.T).view(n, len(self.q_heads), d)
        k = (x @ w.wk.T).view(n, len(self.kv_heads), d)
        v = (x @ w.wv.T).view(n, len(self.kv_heads), d)
        if w.q_norm is not None:
            q, k = rms_norm(q, w.q_norm, s.eps), rms_norm(k, w.k_norm, s.eps)
        q, k = rope(q, batch.positions, s.rope_theta), rope(k, batch.positions, s.rope_theta)
        rv = None if self.v_rotation is None else self.v_rotation[layer]
        if rv is not None:  # a deployment absorbs R_V into wv / wo; done explicitly here to test the slice
            v = rotate_heads(v, rv)
        o = batch.attend(layer, q, k, v)
        if rv is not None:
            o = rotate_heads(o, rv, transpose=True)
        out = o.to(x.dtype).reshape(n, -1) @ w.wo.T
        if self.reduce:
            import torch.distributed as dist

            dist.all_reduce(out, group=self.group)
        return out

    def forward(self, x: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """All layers, each added to the residual stream (no MLP: the attention share alone)."""
        for layer in range(self.n_layers):
            x = x + self.attention(layer, x, batch)
        return x
