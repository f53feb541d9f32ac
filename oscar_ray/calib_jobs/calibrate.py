"""The calibration job: `python -m oscar_ray.calib_jobs.calibrate --config configs/calib/smollm2.yaml`.

Driver flow (every step validated before any worker starts):
  1. config, model geometry, tokenizer, data chunks, output path           (fail fast, name the field)
  2. one Ray actor per model replica in a placement group (GPUs per worker = TP size)
  3. pass 1: C_Q (+ exact C_S) per layer on every shard → reduced in worker order
  4. pass 2: diagonal C_S given C_Q (value_target=diag)
  5. per-layer eigen fits as Ray tasks
  6. pass 3: clip-ratio fit on held-out chunks (clip_mode=fit)
  7. RotationSet written atomically; optionally published to ModelScope
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import CalibrationConfig
from ..models.loader import attention_geometry, load_config, load_tokenizer
from ..quant import RotationSet, fit_rotation
from .fit import ClipFitStats, PassOneStats, PassTwoStats, merge_layer_stats, to_rotation_set
from .sources import shard, token_chunks


def _fit_one(c_q, c_s, composition: str):
    r_k, e_k = fit_rotation(c_q, composition)
    r_v, e_v = fit_rotation(c_s, composition)
    return r_k, r_v, e_k, e_v


class Plan:
    """Everything checked before any work: geometry, chunks, output location."""

    def __init__(self, cfg: CalibrationConfig):
        self.cfg = cfg
        config = load_config(cfg.model)  # raises ValueError naming `model`
        self.geometry = attention_geometry(config)
        g = self.geometry
        cfg.cache.resolved_group_size(g.head_dim)
        if g.head_dim & (g.head_dim - 1):
            raise ValueError(f"model head_dim {g.head_dim} is not a power of two: OSCAR needs a Hadamard of that size")
        tok = load_tokenizer(cfg.model)
        extra = cfg.clipfit_tokens if cfg.clip_mode == "fit" else 0
        chunks = token_chunks(cfg.data, tok, cfg.chunk_len, cfg.token_budget + extra)
        if not chunks:
            raise ValueError(f"data ({cfg.data.source}) produced no tokens")
        fit, total = [], 0
        for c in chunks:
            (fit if total < cfg.token_budget else []).append(c)
            total += c.numel()
        self.fit_chunks = fit
        self.clip_chunks = chunks[len(fit):]
        if cfg.clip_mode == "fit" and not self.clip_chunks:
            raise ValueError(f"clip_mode=fit needs clipfit_tokens held out after the {cfg.token_budget}-token budget, "
                             "but the data ran out; lower token_budget or add data")
        self.tokens = sum(c.numel() for c in self.fit_chunks)
        out = Path(cfg.output.path)
        manifest = out / "manifest.json"
        if manifest.is_file() and not cfg.output.overwrite:
            try:
                RotationSet.load(out, expect=g.model_geometry())
            except ValueError as e:
                raise ValueError(f"output.path {out} holds another artifact ({e}); set output.overwrite or choose "
                                 "another path") from e
        self.ckpt_dir = Path(cfg.checkpoint_dir or out / ".ckpt")


class _RayPool:
    """One CalibWorker actor per model replica, each on its own placement-group bundle."""

    def __init__(self, plan: Plan, n: int):
        import os

        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .worker import KILL_ENV, CalibWorker

        cfg = plan.cfg
        bundle = {"CPU": cfg.cpus_per_worker, **({"GPU": cfg.gpus_per_worker} if cfg.gpus_per_worker else {})}
        self.pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
        ray.get(self.pg.ready(), timeout=600)
        env = {KILL_ENV: os.environ[KILL_ENV]} if os.environ.get(KILL_ENV) else {}
        actor = ray.remote(CalibWorker)
        self.workers = [
            actor.options(num_cpus=cfg.cpus_per_worker, num_gpus=cfg.gpus_per_worker,
                          max_restarts=cfg.max_worker_restarts, max_task_retries=cfg.max_worker_restarts,
                          runtime_env={"env_vars": env} if env else None,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i))
            .remote(i, cfg.model, str(plan.ckpt_dir), cfg.checkpoint_every, cfg.cpus_per_worker, cfg.gpus_per_worker)
            for i in range(n)
        ]

    def run(self, name: str, chunks: list, factory: Callable) -> list:
        import ray

        n = min(len(self.workers), len(chunks))
        refs = []
        for w in range(n):
            ids = shard(chunks, w, n)
            refs.append(self.workers[w].run_pass.remote(name, ids, [chunks[i] for i in ids], factory()))
        return ray.get(refs)

    def fit(self, jobs: list[tuple]) -> list:
        import ray

        # A d×d eigh takes milliseconds; reserving no CPU keeps the tasks from queueing behind the
        # actors, which hold every CPU of their placement-group bundles (a 2-core test cluster: all).
        task = ray.remote(num_cpus=0)(_fit_one)
        return ray.get([task.remote(*job) for job in jobs])

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)


class _LocalPool:
    """The same passes in this process, one worker, no Ray: the single-process reference."""

    def __init__(self, plan: Plan):
        from .worker import CalibWorker

        cfg = plan.cfg
        self.worker = CalibWorker(0, cfg.model, str(plan.ckpt_dir), cfg.checkpoint_every, cfg.cpus_per_worker,
                                  cfg.gpus_per_worker)

    def run(self, name: str, chunks: list, factory: Callable) -> list:
        return [self.worker.run_pass(name, list(range(len(chunks))), chunks, factory())]

    def fit(self, jobs: list[tuple]) -> list:
        return [_fit_one(*job) for job in jobs]

    def close(self) -> None:
        pass


@dataclass
class CalibrationResult:
    rotations: RotationSet
    c_q: dict  # layer -> QueryMoment (merged over workers)
    c_s: dict  # layer -> ValueTargetDiag | ValueTargetSoftmax
    tokens_per_s: dict[str, list[float]]  # pass -> per-worker throughput


def _run_pass(pool, name: str, chunks: list, factory: Callable, log, speeds: dict) -> list:
    t0 = time.time()
    results = pool.run(name, chunks, factory)
    tokens = sum(r[1] for r in results)
    wall = max(time.time() - t0, 1e-9)
    speeds[name] = [r[1] / max(r[2], 1e-9) for r in results if r[1]]
    log(f"{name}: {tokens} tokens in {wall:.1f} s ({tokens / wall:.0f} tok/s; per worker "
        f"{', '.join(f'{x:.0f}' for x in speeds[name])} tok/s)")
    return [r[0] for r in results]


def calibrate(cfg: CalibrationConfig, log: Callable[[str], None] = print, local: bool = False) -> CalibrationResult:
    """Run the whole job on the Ray cluster in reach (a local one is started if none is).

    local=True runs the same passes in this process without Ray (the single-process reference).
    """
    plan = Plan(cfg)
    g = plan.geometry
    log(f"model {cfg.model}: {g.n_layers} layers, {g.n_q_heads}/{g.n_kv_heads} heads, head_dim {g.head_dim}; "
        f"{len(plan.fit_chunks)} chunks ({plan.tokens} tokens per layer), {len(plan.clip_chunks)} clip-fit chunks")
    if local:
        pool = _LocalPool(plan)
    else:
        import ray

        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, log_to_driver=False)
        pool = _RayPool(plan, min(cfg.workers, len(plan.fit_chunks)))
    speeds: dict = {}
    try:
        exact = cfg.value_target == "softmax"
        skip = cfg.cache.sink_tokens
        parts = _run_pass(pool, "pass1", plan.fit_chunks, lambda: PassOneStats(g, exact, skip), log, speeds)
        c_q = merge_layer_stats([p.c_q for p in parts])
        means = None
        if cfg.centre:
            means = tuple({l: m.mean() for l, m in merge_layer_stats([getattr(p, name) for p in parts]).items()}
                          for name in ("k_mean", "v_mean"))
        c_q_heads = {l: m.per_head() for l, m in c_q.items()}
        if exact:
            c_s = merge_layer_stats([p.c_s_softmax for p in parts])
        else:
            parts2 = _run_pass(pool, "pass2", plan.fit_chunks, lambda: PassTwoStats(g, c_q_heads), log, speeds)
            c_s = merge_layer_stats([p.c_s_diag for p in parts2])
        target = (lambda acc: acc.per_head()) if cfg.per_kv_head else (lambda acc: acc.layer())
        layers = sorted(c_q)
        fits = dict(zip(layers, pool.fit([(target(c_q[l]), target(c_s[l]), cfg.composition) for l in layers])))
        log(f"fitted {len(fits)} layers")
        k_clip = {l: cfg.cache.k_clip_ratio for l in layers}
        v_clip = {l: cfg.cache.v_clip_ratio for l in layers}
        if cfg.clip_mode == "fit":
            factory = lambda: ClipFitStats(fits, c_q_heads, cfg.cache.group_size, cfg.cache.scale_dtype, means)  # noqa: E731
            merged = merge_layer_stats([p.clip for p in _run_pass(pool, "pass3", plan.clip_chunks, factory, log, speeds)])
            picks = {l: merged[l].best() for l in layers}
            k_clip, v_clip = {l: p[0] for l, p in picks.items()}, {l: p[1] for l, p in picks.items()}
            log(f"clip fit: K {min(k_clip.values()):.2f}–{max(k_clip.values()):.2f}, "
                f"V {min(v_clip.values()):.2f}–{max(v_clip.values()):.2f}")
    finally:
        pool.close()
    source = cfg.data.source + ":" + ",".join(cfg.data.books if cfg.data.source == "austen" else cfg.data.paths)
    manifest = {"model_id": cfg.model_id, "architecture": g.architecture, "n_kv_heads": g.n_kv_heads,
                "group_size": cfg.cache.resolved_group_size(g.head_dim), "objective": f"qqt_{cfg.composition}",
                "value_target": cfg.value_target, "clip_mode": cfg.clip_mode, "data_source": source,
                "token_count": plan.tokens}
    rs = to_rotation_set(fits, k_clip, v_clip, manifest, means)
    digest = rs.save(cfg.output.path)
    shutil.rmtree(plan.ckpt_dir, ignore_errors=True)
    log(f"wrote {cfg.output.path} (sha256 {digest[:16]}…)")
    if cfg.output.modelscope_id:
        from .publish import publish

        log(publish(cfg.output.path, cfg.output.modelscope_id))
    return CalibrationResult(rs, c_q, c_s, speeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oscar_ray.calib_jobs.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="CalibrationConfig YAML (configs/calib/*.yaml)")
    parser.add_argument("--dry-run", action="store_true", help="print the placement plan, run nothing")
    args = parser.parse_args(argv)
    try:
        cfg = CalibrationConfig.from_file(args.config)
        if args.dry_run:
            from .plan import dry_run

            print(dry_run(cfg))
            return 0
        calibrate(cfg, log=lambda m: print(f"[calibrate] {m}", flush=True))
    except ValueError as e:
        print(f"calibrate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
