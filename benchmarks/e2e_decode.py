"""End-to-end decode through the torch engine: a random Qwen3-8B-shaped model, BF16 vs OSCAR cache.

    PYTHONPATH=. python benchmarks/e2e_decode.py --out $OUT/e2e.json          # H200 (bf16 weights)
    PYTHONPATH=. python benchmarks/e2e_decode.py --smoke --out /tmp/e2e.json  # CPU check of the script

What runs: `EngineCore` (scheduler, allocator, demotions, StepBatch, transformers' Qwen3 with the
paged attention, Triton kernels on CUDA) on a randomly initialised Qwen3-8B geometry (36 layers,
hidden 4096, 32 q / 8 KV heads, d 128, intermediate 12288, q/k norm, vocab 151936; bf16 weights,
nothing fetched).  OSCAR uses data-free Hadamard rotations (no calibration text on the device).
The cache contents are synthetic: prefilling 128K tokens through an 8B model for every point would
cost minutes of device time, so each sequence is admitted through the allocator and its context
is filled with random post-RoPE K/V (std 1, like q/k-normed keys) written by the real write
kernels (`KVStore.write`: INT2 quantise-and-pack for history slots, BF16 for sink/ring slots).
Every decode step then runs the whole engine step: schedule, extend + demote, page tables, the
full 36-layer forward with the split-K decode kernel, logits; the next token is the argmax.
Step time = wall clock of `core.step()` plus the argmax read-back (a host sync), median of repeats;
gpu_ms = the kernels' device time per step (torch.profiler), to tell host-bound from GPU-bound.
No CUDA graphs: the engine plans each step in Python and transformers' forward is eager.

Capacity: with a fixed KV budget (default 40 GiB, both pools), sequences of `--ctx-cap` tokens are
admitted while the pools hold one more including the pages every admitted sequence needs to grow
by the timed steps; then all of them decode together and the step is timed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import tempfile
import time
from collections import Counter

import torch

from benchmarks._kernel_time import kernel_time

GIB = 2**30


def model_config(smoke: bool):
    from transformers import Qwen3Config

    if smoke:
        return Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=8192)
    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)


def random_model(cfg, device: str, dtype: torch.dtype):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in bf16 directly: 8.2B params, 16.4 GB
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def make_core(model, mode: str, budget: int, max_seqs: int, max_len: int, rotations: str | None, device: str,
              dtype: str):
    """mode: bf16, oscar (INT2 keys and values, the default head-major pages), oscar-k3 (3-bit keys, INT2
    values) or oscar-token (INT2, pages stored token-major: cache.page_layout token)."""
    from oscar_ray.engines.torch import TorchEngineConfig
    from oscar_ray.engines.torch.core import EngineCore

    cache = {"page_size": 64, **({"key_bits": 3} if mode == "oscar-k3" else {}),
             **({"page_layout": "token"} if mode == "oscar-token" else {})}
    kv_cache = "bf16" if mode == "bf16" else "oscar"
    cfg = TorchEngineConfig(model="random-qwen3-8b", kv_cache=kv_cache, rotations=rotations if kv_cache == "oscar" else None,
                            max_model_len=max_len, kv_cache_bytes=budget, max_num_seqs=max_seqs,
                            max_batched_tokens=max_seqs, prefix_caching=False, device=device, dtype=dtype, cache=cache)
    return EngineCore(cfg, model, None)


def growth_pages(geom, n_from: int, n_to: int) -> Counter:
    """Pages of each kind a sequence may take while growing from n_from to n_to tokens, with one
    spare of each: a demotion takes its INT2 page before the BF16 one is freed at the step's end."""
    a, b = Counter(k.value for k in geom.layout(n_from)), Counter(k.value for k in geom.layout(n_to))
    return Counter({"int2": max(0, b["int2"] - a["int2"]) + (1 if b["int2"] else 0),
                    "bf16": geom.n_pages(n_to) - geom.n_pages(n_from) + 1})


def admit(core, n: int, gen: torch.Generator, tag: str):
    """Allocate a sequence of n cached tokens (+1 pending) and fill its KV with random post-RoPE K/V
    through the real write path; returns the scheduler's Seq, now running."""
    from oscar_ray.engines.torch.batch import StepBatch, StepItem
    from oscar_ray.engines.torch.scheduler import Seq

    g = core.geometry
    vocab = core.model.config.vocab_size
    seq = Seq(tag, torch.randint(0, vocab, (n + 1,), generator=gen).tolist(), n, 1 << 20)
    core.allocator.allocate(seq.key, n)
    fill = StepBatch(core.store, [StepItem(seq.key, core.allocator.segments(seq.key), 0, n)], core.k_rotation)
    dev = core.store.device
    for layer in range(g.n_layers):
        k = torch.randn(n, g.n_kv_heads, g.head_dim, device=dev, dtype=torch.bfloat16)
        v = torch.randn(n, g.n_kv_heads, g.head_dim, device=dev, dtype=torch.bfloat16)
        core.store.write(layer, k, v, fill.int2_slots, fill.bf16_slots)
    core.allocator.end_step()
    seq.allocated, seq.n_written = True, n
    core.scheduler.running.append(seq)
    return seq


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def decode(core, n_steps: int) -> list[float]:
    """n_steps engine steps of every running sequence; seconds per step."""
    times = []
    for _ in range(n_steps):
        sync(core.device)
        t0 = time.perf_counter()
        result = core.step()
        toks = torch.stack([lg for _, lg in result.sampled]).argmax(-1).tolist()  # host sync
        for (seq, _), tok in zip(result.sampled, toks):
            seq.tokens.append(tok)
        core.finish_step([], [])
        times.append(time.perf_counter() - t0)
    return times


def summary(times: list[float]) -> dict:
    ms = sorted(t * 1e3 for t in times)
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
    return {"median_ms": statistics.median(ms), "p20_ms": q(0.2), "p80_ms": q(0.8), "n": len(ms)}


def run_mode(model, kv_cache: str, args, rotations: str | None) -> dict:
    max_len = max(args.contexts + [args.ctx_cap]) + args.warmup + args.steps + 64
    core = make_core(model, kv_cache, int(args.budget_gib * GIB), args.max_seqs, max_len, rotations, args.device, args.dtype)
    gen = torch.Generator().manual_seed(1)
    out = {"kv_cache": kv_cache, "store_gib": core.store.nbytes() / GIB, "latency": [], "capacity": None}
    u = core.allocator.usage()
    out["pools"] = {"int2_pages": u.int2.total, "bf16_pages": u.bf16.total, "page_size": core.geometry.page_size}
    for ctx in args.contexts:  # batch 1 latency
        seq = admit(core, ctx, gen, f"lat{ctx}")
        decode(core, args.warmup)
        t = decode(core, args.steps)
        out["latency"].append({"context": ctx, "batch": 1, **summary(t),
                               **kernel_time(lambda: decode(core, 1), 3, 12 if ctx == max(args.contexts) else 0)})
        core.scheduler.drop(seq)
        print(f"[{kv_cache}] ctx {ctx} bs 1: {out['latency'][-1]['median_ms']:.2f} ms/step", flush=True)
    # capacity at ctx_cap: admit while one more fits, counting every admitted sequence's growth
    g, n_steps = core.geometry, args.warmup + args.cap_steps
    grow = growth_pages(g, args.ctx_cap, args.ctx_cap + n_steps + 1)
    need_one = Counter(k.value for k in g.layout(args.ctx_cap))
    seqs = []
    t_fill = time.perf_counter()
    while len(seqs) < args.max_seqs:
        u = core.allocator.usage()
        free = {"int2": u.int2.total - u.int2.used, "bf16": u.bf16.total - u.bf16.used}
        if any(need_one[kind] + (len(seqs) + 1) * grow[kind] > free[kind] for kind in free):
            break  # free pages still include the growth reserve of those admitted (not yet taken)
        seqs.append(admit(core, args.ctx_cap, gen, f"cap{len(seqs)}"))
    sync(core.device)
    t_fill = time.perf_counter() - t_fill
    u = core.allocator.usage()
    free = {"int2": u.int2.total - u.int2.used, "bf16": u.bf16.total - u.bf16.used}
    next_fits = all(need_one[k] + (len(seqs) + 1) * grow[k] <= free[k] for k in free)
    pre = core.scheduler.n_preemptions
    decode(core, args.warmup)
    t = decode(core, args.cap_steps)
    kt = kernel_time(lambda: decode(core, 1), 2, 12)
    lens = sorted({s.n_written for s in seqs})
    out["capacity"] = {"context": args.ctx_cap, "admitted": len(seqs), "limited_by_max_seqs": len(seqs) == args.max_seqs,
                       "another_fits": next_fits, "preemptions": core.scheduler.n_preemptions - pre,
                       "running_at_end": len(core.scheduler.running), "context_at_end": lens,
                       "free_pages_after_admission": free, "fill_s": t_fill, **summary(t),
                       "tokens_per_s": len(seqs) / (statistics.median(t)), **kt}
    print(f"[{kv_cache}] capacity at {args.ctx_cap}: {len(seqs)} sequences, "
          f"{out['capacity']['median_ms']:.2f} ms/step", flush=True)
    for s in seqs:
        core.scheduler.drop(s)
    del core
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return out


def environment(args) -> dict:
    import triton

    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        env["commit"] = "unknown"
    if args.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (reference ops): checks the script")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--ctx-cap", type=int, default=131072)
    ap.add_argument("--budget-gib", type=float, default=40.0)
    ap.add_argument("--max-seqs", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cap-steps", type=int, default=10)
    ap.add_argument("--modes", nargs="+", default=["bf16", "oscar"], choices=["bf16", "oscar", "oscar-k3", "oscar-token"])
    args = ap.parse_args()
    args.device, args.dtype = ("cpu", "float32") if args.smoke else ("cuda", "bfloat16")
    if args.smoke:
        args.contexts, args.ctx_cap, args.budget_gib, args.steps, args.cap_steps, args.max_seqs = [700, 1400], 1400, 0.01, 3, 2, 8
    from oscar_ray.models.rotations import hadamard_rotations

    cfg = model_config(args.smoke)
    cfg.max_position_embeddings = max(args.contexts + [args.ctx_cap]) + 1024
    model = random_model(cfg, args.device, torch.float32 if args.smoke else torch.bfloat16)
    rot_dir = tempfile.mkdtemp(prefix="oscar_rot_")
    hadamard_rotations(model, 0.96, 0.92).save(rot_dir)
    res = {"env": environment(args), "args": vars(args), "modes": {}}
    res["env"]["params"] = sum(p.numel() for p in model.parameters())
    # bf16 first: an OSCAR core absorbs R_V into the model in place (a second one with the same
    # artifact finds it absorbed and leaves the weights alone)
    for mode in args.modes:
        res["modes"][mode] = run_mode(model, mode, args, rot_dir)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res["modes"], indent=1))


if __name__ == "__main__":
    main()
