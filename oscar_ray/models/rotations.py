"""Where the engine's rotations come from: an artifact, a cached quick calibration, or Hadamard.

`resolve_rotations(model, tokenizer, path)`:
  1. `path` given → `RotationSet.load(path, expect=geometry)` (the calibration job's artifact);
  2. else a quick OSCAR calibration on Austen text (the authors' C_Q key target and diagonal value
     target, R = U·H·P; mode "best" adds per-KV-head rotations, centring and fitted clip ratios,
     see `quick_calibration`), cached under OSCAR_CACHE_DIR/rotations/<sha of model + settings>;
     SmolLM2 on 2 cores: 2048 tokens (+ 512 for the clip fit), ~20 s once, then a load of a few ms;
  3. if the calibration text cannot be fetched → data-free Hadamard rotations (QuaRot-style) with
     a logged warning: a working cache, but ~2× the attention error of OSCAR rotations.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from ..quant import ChannelMean, ClipFit, QueryMoment, RotationSet, ValueTargetDiag, fit_rotation, hadamard
from .loader import attention_geometry

log = logging.getLogger(__name__)
QUICK_IMPL = "oscar_quick_calib"
_SINK = "_oscar_quick_sink"
QUICK_BOOK = "emma"
QUICK_SEQ_LEN = 512
QUICK_SEQS = 4  # 2048 tokens per layer: enough for SmolLM2's 64×64 targets (~30 tokens per entry)
QUICK_MODES = ("best", "authors")


def _capture(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sink = getattr(module, _SINK, None)
    if sink is not None:  # [1, H, T, d] → [T, H, d]
        sink(module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@torch.inference_mode()
def _run(model, seqs: list[torch.Tensor], sink) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(QUICK_IMPL, _capture)
    mods = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "k_proj")]
    previous = model.config._attn_implementation
    for m in mods:
        setattr(m, _SINK, sink)
    model.set_attn_implementation(QUICK_IMPL)
    try:
        for ids in seqs:
            model(input_ids=ids[None, :].to(model.device), use_cache=False)
    finally:
        for m in mods:
            delattr(m, _SINK)
        model.set_attn_implementation(previous)


def quick_calibration(model, tokenizer, k_clip: float, v_clip: float, book: str = QUICK_BOOK,
                      seq_len: int = QUICK_SEQ_LEN, n_seqs: int = QUICK_SEQS, mode: str = "best",
                      sink_tokens: int = 64) -> RotationSet:
    """Two passes over `n_seqs` × `seq_len` tokens of an Austen novel: C_Q (and the key/value channel
    means), then the diagonal value target w_t = k_t C_Q k_tᵀ; R = U·H·P for K and V.

    mode "authors": one rotation per layer, the fixed clip ratios k_clip / v_clip, no centring (the
    paper's settings). mode "best": one rotation per KV head, centred keys and values, and per-layer
    clip ratios fitted on one further held-out sequence (`quality_smollm2.md`: attention-output
    error 0.67 → 0.38 on SmolLM2)."""
    from ..assets import austen_books

    if mode not in QUICK_MODES:
        raise ValueError(f"quick calibration mode must be one of {QUICK_MODES}, got {mode!r}")
    best = mode == "best"
    g = attention_geometry(model.config)
    ids = tokenizer(austen_books()[book], add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    seqs = [ids[i * seq_len:(i + 1) * seq_len] for i in range(n_seqs + best)]
    seqs, held_out = seqs[:n_seqs], seqs[n_seqs:]
    c_q: dict[int, QueryMoment] = {}
    means: dict[int, tuple[ChannelMean, ChannelMean]] = {}

    def pass_one(layer, q, k, v):
        c_q.setdefault(layer, QueryMoment(g.n_kv_heads, g.head_dim, n_q_heads=g.n_q_heads)).update(q)
        if best:  # the authors' mode stores no means
            mk, mv = means.setdefault(layer, tuple(ChannelMean(g.n_kv_heads, g.head_dim, sink_tokens) for _ in "kv"))
            mk.update(k), mv.update(v)

    _run(model, seqs, pass_one)
    per_head = {l: m.per_head() for l, m in c_q.items()}
    c_s: dict[int, ValueTargetDiag] = {}

    def pass_two(layer, q, k, v):
        c_s.setdefault(layer, ValueTargetDiag(g.n_kv_heads, g.head_dim, c_q=per_head[layer])).update(k, v)

    _run(model, seqs, pass_two)
    target = (lambda acc: acc.per_head()) if best else (lambda acc: acc.layer())
    fits = [(fit_rotation(target(c_q[l])), fit_rotation(target(c_s[l]))) for l in range(g.n_layers)]
    k_clips, v_clips = [float(k_clip)] * g.n_layers, [float(v_clip)] * g.n_layers
    extra = {}
    if best:
        extra = {"k_mean": torch.stack([means[l][0].mean() for l in range(g.n_layers)]),
                 "v_mean": torch.stack([means[l][1].mean() for l in range(g.n_layers)])}
        clip = {l: ClipFit(per_head[l], fits[l][0][0], fits[l][1][0], k_mean=extra["k_mean"][l],
                           v_mean=extra["v_mean"][l]) for l in range(g.n_layers)}
        _run(model, held_out, lambda layer, q, k, v: clip[layer].update(k, v))
        k_clips, v_clips = zip(*(clip[l].best() for l in range(g.n_layers)))
    manifest = {"model_id": getattr(model.config, "_name_or_path", "unknown") or "unknown",
                "architecture": g.architecture, "n_kv_heads": g.n_kv_heads,
                "token_count": seq_len * n_seqs, "data_source": f"austen:{book}", "objective": "qqt_r_h_pbr",
                "clip_mode": "fit" if best else "fixed", "quick_calibration": mode}
    return RotationSet(torch.stack([k[0] for k, _ in fits]), torch.stack([v[0] for _, v in fits]),
                       torch.stack([k[1] for k, _ in fits]), torch.stack([v[1] for _, v in fits]),
                       torch.tensor(k_clips), torch.tensor(v_clips), manifest=manifest, **extra)


def hadamard_rotations(model, k_clip: float, v_clip: float) -> RotationSet:
    """Data-free rotations (normalised Hadamard for K and V in every layer), QuaRot-style."""
    g = attention_geometry(model.config)
    h = hadamard(g.head_dim).expand(g.n_layers, g.head_dim, g.head_dim)
    ones = torch.ones(g.n_layers, g.head_dim)
    return RotationSet(h, h.clone(), ones, ones.clone(), torch.full((g.n_layers,), float(k_clip)),
                       torch.full((g.n_layers,), float(v_clip)),
                       manifest={"architecture": g.architecture, "n_kv_heads": g.n_kv_heads,
                                 "objective": "hadamard", "data_source": "none"})


def _cache_key(model, k_clip: float, v_clip: float, mode: str, sink_tokens: int) -> str:
    cfg = model.config
    sample = next(model.parameters()).detach().flatten()[:4096].double()  # weights, not just the shape
    ident = {"config": cfg.to_dict() if hasattr(cfg, "to_dict") else str(cfg), "k_clip": k_clip, "v_clip": v_clip,
             "book": QUICK_BOOK, "seq_len": QUICK_SEQ_LEN, "seqs": QUICK_SEQS, "weights": float(sample.sum()),
             "mode": mode, "sink": sink_tokens, "version": 2}
    for drop in ("_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        ident["config"].pop(drop, None) if isinstance(ident["config"], dict) else None
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_rotations(model, tokenizer, path: str | None, k_clip: float, v_clip: float,
                      cache_root: Path | None = None, mode: str = "best", sink_tokens: int = 64) -> RotationSet:
    """The rotations an engine serves with (see the module docstring for the order of sources).
    Call before `absorb_value_rotation`: the quick calibration needs the unmodified weights."""
    g = attention_geometry(model.config)
    if path is not None:
        return RotationSet.load(path, expect=g.model_geometry())
    from ..env import cache_dir

    root = (cache_root or cache_dir() / "rotations") / _cache_key(model, k_clip, v_clip, mode, sink_tokens)
    if (root / "manifest.json").is_file():
        try:
            return RotationSet.load(root, expect=g.model_geometry())
        except ValueError as e:  # a damaged cache entry: recompute it
            log.warning("cached rotations at %s unusable (%s); recalibrating", root, e)
    try:
        from ..assets import AssetError

        rs = quick_calibration(model, tokenizer, k_clip, v_clip, mode=mode, sink_tokens=sink_tokens)
    except (AssetError, OSError) as e:
        log.warning("no calibration text (%s): serving with data-free Hadamard rotations, expect about "
                    "twice OSCAR's attention error; pass `rotations` (an artifact) to fix", e)
        return hadamard_rotations(model, k_clip, v_clip)
    rs.save(root)
    log.info("quick OSCAR calibration cached at %s", root)
    return rs
