"""`--dry-run`: the placement and cost of a calibration, from the config alone (no weights loaded)."""

from __future__ import annotations

from ..config import CalibrationConfig

GIB = 1024**3


def dry_run(cfg: CalibrationConfig) -> str:
    """A text plan: actors, GPUs, memory per GPU, statistics size, expected time.

    Uses `model_facts` when given (a 358B model's files need not be on the planning machine), else
    the model's own config.
    """
    if cfg.model_facts is not None:
        f = cfg.model_facts
        layers, hq, hkv, d, params_b, bpp = f.n_layers, f.n_q_heads, f.n_kv_heads, f.head_dim, f.n_params_b, f.bytes_per_param
    else:
        from ..models.loader import attention_geometry, load_config

        conf = load_config(cfg.model)
        g = attention_geometry(conf)
        layers, hq, hkv, d = g.n_layers, g.n_q_heads, g.n_kv_heads, g.head_dim
        params_b = getattr(conf, "num_parameters", None) or 0.135
        bpp = 4.0
    if hq % hkv:
        raise ValueError(f"model_facts.n_q_heads ({hq}) must be a multiple of n_kv_heads ({hkv})")
    if d & (d - 1):
        raise ValueError(f"model_facts.head_dim ({d}) must be a power of two")
    gpus = cfg.workers * cfg.gpus_per_worker
    weights = params_b * 1e9 * bpp
    per_gpu = weights / max(cfg.gpus_per_worker, 1)
    # Capture memory: q, k, v of one chunk for one layer at a time in fp32, plus the fp64 d×d sums.
    act = cfg.chunk_len * (hq + 2 * hkv) * d * 4
    n_mats = 2  # C_Q and C_S per KV head
    stats = layers * hkv * n_mats * d * d * 8
    extra = cfg.clipfit_tokens if cfg.clip_mode == "fit" else 0
    passes = (1 if cfg.value_target == "softmax" else 2) + (1 if cfg.clip_mode == "fit" else 0)
    lines = [
        f"model {cfg.model_id}: {layers} layers, {hq}/{hkv} heads, head_dim {d}, {params_b:g}B params",
        f"actors: {cfg.workers} × (GPUs {cfg.gpus_per_worker}, CPUs {cfg.cpus_per_worker}) = {gpus} GPUs, "
        "one placement-group bundle per actor (PACK)",
        f"weights per GPU: {per_gpu / GIB:.1f} GiB ({bpp:g} B/param, sharded over the actor's GPUs)",
        f"capture buffer per layer per chunk: {act / GIB * 1024:.1f} MiB; statistics per actor: "
        f"{stats / GIB * 1024:.1f} MiB (fp64, {n_mats} d×d per KV head per layer), reduced through the object store",
        f"tokens: {cfg.token_budget} per layer for the fit + {extra} for the clip fit, in chunks of {cfg.chunk_len}; "
        f"{passes} pass(es) over the data",
    ]
    if cfg.measured_tokens_per_s:
        total = (cfg.token_budget * (passes - (1 if extra else 0)) + extra) / (cfg.measured_tokens_per_s * cfg.workers)
        lines.append(f"expected time: {total / 60:.1f} min ({total:.0f} s) at {cfg.measured_tokens_per_s:g} tok/s per actor")
    else:
        lines.append("expected time: unknown (set measured_tokens_per_s)")
    return "\n".join(lines)
