"""Calibration statistics on one GPU: tokens/s of each pass, and data-parallel exactness.

    PYTHONPATH=. python benchmarks/calib_gpu.py --out $OUT/calib_gpu.json          # H200
    PYTHONPATH=. python benchmarks/calib_gpu.py --smoke --out /tmp/calib_gpu.json   # CPU check

What runs: the calibration job's own capture hook and accumulators (`calib_jobs.capture.run_sequences`
into `PassOneStats` / `PassTwoStats` / `ClipFitStats`, reduced with `merge_layer_stats`, fitted with
`fit_layers`) on a randomly initialised Qwen3-8B-shaped model (bf16 weights, fp64 statistics), with
random token sequences (no text or weights can be fetched on the device). Ray itself does not run:
the GPU image has no Ray wheel, and one GPU gives no scaling to measure. "Data parallel" here is the
job's reduction: the sequences are split round-robin into N shards as the driver assigns them, each
shard accumulated separately, the shards merged in worker order; the merged statistics and the
rotations fitted from them are compared with the single-shard run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from benchmarks.e2e_decode import model_config, random_model
from oscar_ray.calib_jobs.capture import run_sequences
from oscar_ray.calib_jobs.fit import ClipFitStats, PassOneStats, PassTwoStats, fit_layers, merge_layer_stats
from oscar_ray.models.loader import attention_geometry


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_pass(model, seqs, make_stats, device, repeats):
    """(stats of the last repeat, median tokens/s over `repeats` runs of the same pass)."""
    speeds, stats = [], None
    for _ in range(repeats):
        stats = make_stats()
        _sync(device)
        t0 = time.perf_counter()
        tokens = run_sequences(model, seqs, stats.sink)
        _sync(device)
        speeds.append(tokens / (time.perf_counter() - t0))
    return stats, statistics.median(speeds)


def sharded(model, seqs, make_stats, n):
    parts = []
    for w in range(n):
        stats = make_stats()
        run_sequences(model, [seqs[i] for i in range(w, len(seqs), n)], stats.sink)
        parts.append(stats)
    return parts


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (checks the script)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shards", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    cfg = model_config(args.smoke)
    model = random_model(cfg, device, torch.float32 if device == "cpu" else torch.bfloat16)
    geom = attention_geometry(cfg)
    gen = torch.Generator().manual_seed(0)
    seq_len = min(args.seq_len, 256) if args.smoke else args.seq_len
    seqs = [torch.randint(0, cfg.vocab_size, (seq_len,), generator=gen).to(device) for _ in range(args.seqs)]
    # held-out sequences for the clip-fit pass, as the job keeps clip chunks apart from fit chunks
    held = [torch.randint(0, cfg.vocab_size, (seq_len,), generator=gen).to(device) for _ in range(2)]

    one, tps1 = timed_pass(model, seqs, lambda: PassOneStats(geom, exact_value_target=True), device, args.repeats)
    c_q = {l: acc.per_head() for l, acc in one.c_q.items()}
    two, tps2 = timed_pass(model, seqs, lambda: PassTwoStats(geom, c_q), device, args.repeats)
    fits = fit_layers(one.c_q, one.c_s_softmax)
    clip, tps3 = timed_pass(model, held, lambda: ClipFitStats(fits, c_q), device, 1)
    k_clip, v_clip = clip.best()

    exact = []
    for n in args.shards:
        parts = sharded(model, seqs, lambda: PassOneStats(geom, exact_value_target=True), n)
        cq = merge_layer_stats([p.c_q for p in parts])
        cs = merge_layer_stats([p.c_s_softmax for p in parts])
        fits_n = fit_layers(cq, cs)
        exact.append({
            "shards": n,
            "c_q_max_rel": max(rel(cq[l].sums, one.c_q[l].sums) for l in cq),
            "c_s_max_rel": max(rel(cs[l].sums, one.c_s_softmax[l].sums) for l in cs),
            "r_k_max_abs": max(float((fits_n[l][0] - fits[l][0]).abs().max()) for l in fits),
            "r_v_max_abs": max(float((fits_n[l][1] - fits[l][1]).abs().max()) for l in fits),
            "rows_equal": all(cq[l].rows == one.c_q[l].rows for l in cq),
        })
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit or "unknown",
        "torch": torch.__version__, "model": "random Qwen3-8B shape" if not args.smoke else "tiny Qwen3",
        "layers": geom.n_layers, "q_heads": geom.n_q_heads, "kv_heads": geom.n_kv_heads, "head_dim": geom.head_dim,
        "seq_len": seq_len, "seqs": len(seqs), "repeats": args.repeats,
        "tokens_per_s": {"pass1 (C_Q + exact C_S)": tps1, "pass2 (diag C_S)": tps2, "clip fit": tps3},
        "clip_ratios_k_range": [min(k_clip.values()), max(k_clip.values())],
        "clip_ratios_v_range": [min(v_clip.values()), max(v_clip.values())],
        "data_parallel": exact,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
