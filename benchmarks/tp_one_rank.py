"""One tensor-parallel rank's attention share per decode step, OSCAR pools vs a BF16 cache with SDPA.

    PYTHONPATH=. python benchmarks/tp_one_rank.py --out $OUT/tp.json          # one H200
    PYTHONPATH=. python benchmarks/tp_one_rank.py --smoke --out /tmp/tp.json  # CPU check of the script

No NCCL, no second GPU: this times what ONE rank's GPU does in the attention layers of a decode
step, for rank 0 of Qwen3-32B at TP4 (64 layers, 64 q / 8 KV heads → 16 q / 2 KV heads a rank) and
of GLM-4.7 at TP8 (92 layers, 96 q / 8 KV → 12 q / 1 KV head a rank), hidden 5120, d 128, q/k norm.
Per layer: the rank's q/k/v projection rows, q/k RMSNorm, RoPE, the new token's K/V write, attention
over the rank's heads, the rank's o_proj columns, a residual add.  Not included: the all-reduce
after o_proj (each rank's output is summed over NVLink in a real TP run), the MLP / MoE, norms
between layers, embedding and logits.  Weights are random per-rank slices (bf16).
  OSCAR: `TPAttentionStack` (oscar_ray/engines/tp.py), the per-rank KVStore with INT2 history +
  BF16 sink 64 / recent 256, split-K decode kernel; Hadamard R_K, R_V absorbed (not applied).
  BF16: the same projections over a contiguous BF16 K/V cache [B, H_kv, T, d] per layer with torch
  SDPA (flash backend when it runs the shape), the new token written in place.
Cache contents are random (post-RoPE-like K/V of std 1), written through the real write kernels for
OSCAR.  Each step is captured in one CUDA graph (all layers) and replayed; ms = median (p20-p80)
of single replays timed with CUDA events.  Eager (no graph) medians are given for reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks._kernel_time import kernel_time
from oscar_ray.engines.tp import AttentionShape, AttentionWeights, TPAttentionStack, rms_norm, rope

MODELS = {  # name: (global shape, layers, tp)
    "qwen3-32b": (AttentionShape(5120, 64, 8, 128), 64, 4),
    "glm-4.7": (AttentionShape(5120, 96, 8, 128), 92, 8),
}


def _sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def make(backend):
        def call(q, k, v):
            with sdpa_kernel([backend]):
                return sdpa(q, k, v, enable_gqa=True)
        return call
    return [(b.name.lower(), make(b)) for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                                SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)]


class BF16Stack:
    """The same per-rank layers over contiguous BF16 caches with SDPA (the baseline)."""

    def __init__(self, shape, weights, hq, hkv, batch, ctx, device):
        self.shape, self.weights, self.hq, self.hkv, self.ctx = shape, weights, hq, hkv, ctx
        d = shape.head_dim
        self.k = [torch.empty(batch, hkv, ctx + 1, d, dtype=torch.bfloat16, device=device).normal_() for _ in weights]
        self.v = [torch.empty(batch, hkv, ctx + 1, d, dtype=torch.bfloat16, device=device).normal_() for _ in weights]
        self.pos = torch.full((batch,), ctx, device=device)
        self.call, self.backend = None, None

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def attention(self, layer, x):
        w, s, d = self.weights[layer], self.shape, self.shape.head_dim
        b = x.shape[0]
        q = rms_norm((x @ w.wq.T).view(b, self.hq, d), w.q_norm, s.eps)
        k = rms_norm((x @ w.wk.T).view(b, self.hkv, d), w.k_norm, s.eps)
        v = (x @ w.wv.T).view(b, self.hkv, d)
        q, k = rope(q, self.pos, s.rope_theta), rope(k, self.pos, s.rope_theta)
        self.k[layer][:, :, self.ctx] = k
        self.v[layer][:, :, self.ctx] = v
        if self.call is None:
            for name, call in _sdpa():
                try:
                    call(q[:, :, None], self.k[layer], self.v[layer])
                    self.backend, self.call = name, call
                    break
                except (RuntimeError, NotImplementedError, ValueError):
                    continue
        o = self.call(q[:, :, None], self.k[layer], self.v[layer])  # [B, hq, 1, d]
        return o.reshape(b, -1).to(x.dtype) @ w.wo.T

    def forward(self, x):
        for layer in range(len(self.weights)):
            x = x + self.attention(layer, x)
        return x


def oscar_stack(shape, weights, tp, batch, ctx, device, use_kernels):
    from oscar_ray.quant import hadamard

    g_pages = -(-(ctx + 2) // 64)
    n_layers = len(weights)
    r = hadamard(shape.head_dim).expand(n_layers, shape.head_dim, shape.head_dim).contiguous()
    stack = TPAttentionStack(shape, weights, 0, tp, n_int2_pages=batch * g_pages, n_bf16_pages=batch * 8,
                             k_rotation=r, v_rotation=None, device=device, sharded=True, reduce=False,
                             use_kernels=use_kernels)
    from oscar_ray.engines.torch.batch import StepBatch, StepItem

    h = len(stack.kv_heads)
    for i in range(batch):
        stack.allocator.allocate(i, ctx)
        fill = StepBatch(stack.store, [StepItem(i, stack.allocator.segments(i), 0, ctx)], stack.k_rotation)
        for layer in range(n_layers):
            k = torch.randn(ctx, h, shape.head_dim, device=device, dtype=torch.bfloat16)
            v = torch.randn(ctx, h, shape.head_dim, device=device, dtype=torch.bfloat16)
            stack.store.write(layer, k, v, fill.int2_slots, fill.bf16_slots)
        stack.allocator.end_step()
    for i in range(batch):
        a = stack.allocator.extend(i, 1)
        stack.store.demote(list(a.demotions))
    stack.allocator.end_step()
    return stack, stack.batch([(i, ctx, 1) for i in range(batch)])


def timed(fn, device, graph: bool, reps: int) -> dict:
    cuda = device.type == "cuda"
    if graph and cuda:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    for _ in range(3):
        run()
    ms = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            run()
            ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return {"median_ms": statistics.median(ms), "p20_ms": ms[int(0.2 * len(ms))], "p80_ms": ms[int(0.8 * len(ms))]}


def run_point(name, shape, weights, tp, batch, ctx, device, args):
    from oscar_ray.engines.tp import q_heads_of_rank
    from oscar_ray.engines.sglang.sharding import kv_heads_of_rank

    hq, hkv = len(q_heads_of_rank(shape.n_q_heads, shape.n_kv_heads, 0, tp)), len(kv_heads_of_rank(shape.n_kv_heads, 0, tp))
    x = torch.randn(batch, shape.hidden, device=device, dtype=torch.bfloat16) * 0.1
    row = {"model": name, "tp": tp, "q_heads": hq, "kv_heads": hkv, "layers": len(weights), "batch": batch, "context": ctx}
    with torch.inference_mode():
        stack, step = oscar_stack(shape, weights, tp, batch, ctx, device, None if not args.smoke else False)
        row["oscar_cache_gib"] = stack.store.nbytes() / 2**30
        row["oscar_eager"] = timed(lambda: stack.forward(x, step), device, False, 5)  # also compiles, before capture
        row["oscar_graph"] = timed(lambda: stack.forward(x, step), device, True, args.reps)
        row["oscar_kernels"] = kernel_time(lambda: stack.forward(x, step), 2, 10 if (batch, ctx) in args.top else 0)
        del stack, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
        base = BF16Stack(shape, weights, hq, hkv, batch, ctx, device)
        row["bf16_cache_gib"] = base.nbytes() / 2**30
        row["bf16_eager"] = timed(lambda: base.forward(x), device, False, 5)
        row["bf16_graph"] = timed(lambda: base.forward(x), device, True, args.reps)
        row["bf16_kernels"] = kernel_time(lambda: base.forward(x), 2, 10 if (batch, ctx) in args.top else 0)
        row["sdpa_backend"] = base.backend
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
    row["speedup_graph"] = row["bf16_graph"]["median_ms"] / row["oscar_graph"]["median_ms"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    args.top = {(1, 32768), (8, 131072)}  # points whose top kernels are recorded
    device = torch.device("cpu" if args.smoke else "cuda")
    rows = []
    for name in args.models:
        shape, n_layers, tp = MODELS[name]
        if args.smoke:
            n_layers, args.contexts, args.reps = 2, [600], 3
        g = torch.Generator(device=device).manual_seed(0)
        torch.manual_seed(0)
        weights = [AttentionWeights.random_shard(shape, 0, tp, g, device=device) for _ in range(n_layers)]
        for batch in args.batches:
            for ctx in args.contexts:
                try:
                    row = run_point(name, shape, weights, tp, batch, ctx, device, args)
                except Exception as e:  # noqa: BLE001 - record and go on: one lease, many points
                    row = {"model": name, "batch": batch, "context": ctx, "error": repr(e)[:500]}
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
        del weights
    for r in rows:
        if "error" not in r:
            print(f"{r['model']:10s} bs {r['batch']} ctx {r['context']:6d}: oscar {r['oscar_graph']['median_ms']:.3f} ms "
                  f"bf16 {r['bf16_graph']['median_ms']:.3f} ms ({r['sdpa_backend']}) x{r['speedup_graph']:.2f}")


if __name__ == "__main__":
    main()
