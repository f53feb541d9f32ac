"""`oscar-ray quality`: OSCAR vs INT2 baselines on real activations of a real model.

Captures post-RoPE Q/K/V of SmolLM2 on one Austen novel, fits OSCAR rotations (and clip ratios on
held-out calibration tokens), then on another novel reports per layer and overall the
attention-output relative error ‖O − Ô‖/‖O‖ and the relative logit error ‖Q(K − K̂)ᵀ‖²/‖QKᵀ‖² of
each quantiser at equal bits (2-bit codes + 16-bit scale/zero per row).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import QualityConfig
from ..models.loader import attention_geometry, load_model
from ..quant import hadamard, kivi2, logit_error, naive_int2, oscar_int2, quarot_int2, reference_attention
from ..quant.int2 import fake_quantize
from .capture import run_sequences
from .data import book_sequences
from .fit import ClipFitStats, PassOneStats, PassTwoStats, fit_layers, key_feedback_factors

# BEST's rotations and means with query-aware key rounding (quant/feedback.py) and key clip ratios
# fitted on the attention-output error; math core only so far, the cache's write kernels round nearest
QUERY_AWARE = "OSCAR (per KV head, centred, query-aware rounding)"
METHODS = ("naive INT2", "QuaRot-INT2", "QuaRot-INT2 + clip", "KIVI-2", "OSCAR", "OSCAR (exact C_S)",
           "OSCAR (fitted clip)", "OSCAR (per KV head)",
           "OSCAR (per KV head, fitted clip)", "OSCAR (centred)", "OSCAR (per KV head, centred, fitted clip)", QUERY_AWARE)
# what `oscar-ray calibrate` writes with per_kv_head, clip_mode fit and centre on
BEST = "OSCAR (per KV head, centred, fitted clip)"


@dataclass
class ErrorSums:
    """Additive numerators/denominators so errors over several sequences combine exactly."""

    out_err: float = 0.0
    out_ref: float = 0.0
    logit_err: float = 0.0
    logit_ref: float = 0.0

    def add(self, q, k, v, k_hat, v_hat, out_ref: torch.Tensor) -> None:
        out_hat = reference_attention(q, k_hat, v_hat, dtype=torch.float32)
        self.out_err += float((out_ref - out_hat).double().pow(2).sum())
        self.out_ref += float(out_ref.double().pow(2).sum())
        self.logit_err += logit_error(q, k, k_hat, relative=False)
        self.logit_ref += logit_error(q, k, torch.zeros_like(k), relative=False)  # ‖QKᵀ‖²

    @property
    def attention_error(self) -> float:
        return (self.out_err / self.out_ref) ** 0.5

    @property
    def logit_error(self) -> float:
        return self.logit_err / self.logit_ref


@dataclass
class QualityResult:
    config: QualityConfig
    n_layers: int
    head_dim: int
    tokens: dict[str, int]
    errors: dict[str, dict[int, ErrorSums]]  # method -> layer -> sums
    clip: dict[str, dict[int, float]]
    seconds: float
    extra: dict = field(default_factory=dict)

    def overall(self, method: str) -> ErrorSums:
        total = ErrorSums()
        for s in self.errors[method].values():
            total.out_err += s.out_err
            total.out_ref += s.out_ref
            total.logit_err += s.logit_err
            total.logit_ref += s.logit_ref
        return total


def _quantisers(fits, fitted_clip, cfg, means, centred_clip, feedback=None, qa_clip=None) -> dict[str, Callable]:
    c = cfg.cache
    gs, sd = c.group_size, c.scale_dtype

    def oscar(layer, k, v, which=0, k_clip=c.k_clip_ratio, v_clip=c.v_clip_ratio, centre=False):
        r_k, r_v = fits[which][layer][0], fits[which][layer][1]
        mk, mv = (means[0][layer], means[1][layer]) if centre else (None, None)
        return oscar_int2(k, v, r_k, r_v, k_clip, v_clip, gs, sd, c.lloyd_max, mk, mv)

    def quarot_clip(layer, k, v):
        h = hadamard(k.shape[-1])
        return (fake_quantize(k, h, c.k_clip_ratio, gs, sd), fake_quantize(v, h, c.v_clip_ratio, gs, sd))

    return {
        "naive INT2": lambda layer, k, v: naive_int2(k, v, gs, sd),
        "QuaRot-INT2": lambda layer, k, v: quarot_int2(k, v, gs, sd),
        "QuaRot-INT2 + clip": quarot_clip,
        "KIVI-2": lambda layer, k, v: kivi2(k, v, token_group=gs or k.shape[-1], residual=0, scale_dtype=sd),
        "OSCAR": oscar,
        "OSCAR (exact C_S)": lambda layer, k, v: oscar(layer, k, v, which=1),
        "OSCAR (fitted clip)": lambda layer, k, v: oscar(layer, k, v, 0, fitted_clip[0][layer], fitted_clip[1][layer]),
        "OSCAR (per KV head)": lambda layer, k, v: oscar(layer, k, v, which=2),
        # the per-layer fitted ratios, reused: a per-head clip fit would need its own 24 tok/s pass
        "OSCAR (per KV head, fitted clip)": lambda layer, k, v: oscar(layer, k, v, 2, fitted_clip[0][layer],
                                                                      fitted_clip[1][layer]),
        "OSCAR (centred)": lambda layer, k, v: oscar(layer, k, v, centre=True),
        BEST: lambda layer, k, v: oscar(layer, k, v, 2, centred_clip[0][layer], centred_clip[1][layer], centre=True),
        QUERY_AWARE: lambda layer, k, v: oscar_int2(
            k, v, fits[2][layer][0], fits[2][layer][1], qa_clip[0][layer], centred_clip[1][layer], gs, sd, False,
            means[0][layer], means[1][layer], feedback[layer]),
    }


def run_quality(cfg: QualityConfig, log: Callable[[str], None] = print, model=None, tokenizer=None) -> QualityResult:
    t0 = time.time()
    if model is None:
        log(f"loading {cfg.model} …")
        model, tokenizer = load_model(cfg.model)
    geom = attention_geometry(model.config)
    n_calib = cfg.calib_seqs + cfg.clipfit_seqs
    calib = book_sequences(tokenizer, cfg.calib_book, cfg.seq_len, n_calib)
    fit_seqs, clip_seqs = calib[: cfg.calib_seqs], calib[cfg.calib_seqs :]
    evals = book_sequences(tokenizer, cfg.eval_book, cfg.seq_len, cfg.eval_seqs, skip=1)  # skip title pages

    log(f"pass 1: C_Q and exact C_S over {len(fit_seqs)}×{cfg.seq_len} tokens of {cfg.calib_book}")
    p1 = PassOneStats(geom, mean_skip=cfg.cache.sink_tokens)
    run_sequences(model, fit_seqs, p1.sink)
    means = ({l: m.mean() for l, m in p1.k_mean.items()}, {l: m.mean() for l, m in p1.v_mean.items()})
    c_q_heads = {l: m.per_head() for l, m in p1.c_q.items()}
    log("pass 2: diagonal-proxy C_S (needs C_Q)")
    p2 = PassTwoStats(geom, c_q_heads)
    run_sequences(model, fit_seqs, p2.sink)
    fits_diag = fit_layers(p1.c_q, p2.c_s_diag)
    fits_soft = fit_layers(p1.c_q, p1.c_s_softmax)
    fits_head = fit_layers(p1.c_q, p2.c_s_diag, per_kv_head=True)

    fitted = ({l: cfg.cache.k_clip_ratio for l in fits_diag}, {l: cfg.cache.v_clip_ratio for l in fits_diag})
    centred_clip = qa_clip = fitted
    feedback = key_feedback_factors(fits_head, c_q_heads)
    if clip_seqs:
        log(f"clip fit on {len(clip_seqs)} held-out calibration sequence(s)")
        cs = ClipFitStats(fits_diag, c_q_heads, cfg.cache.group_size, cfg.cache.scale_dtype)
        cs_best = ClipFitStats(fits_head, c_q_heads, cfg.cache.group_size, cfg.cache.scale_dtype, means)
        cs_qa = ClipFitStats(fits_head, c_q_heads, cfg.cache.group_size, cfg.cache.scale_dtype, means, feedback,
                             key_objective="attention", sink_tokens=cfg.cache.sink_tokens)

        def fits_all(layer, q, k, v):
            for acc in (cs, cs_best, cs_qa):
                acc.sink(layer, q, k, v)

        run_sequences(model, clip_seqs, fits_all)
        fitted, centred_clip, qa_clip = cs.best(), cs_best.best(), cs_qa.best()

    quantisers = _quantisers((fits_diag, fits_soft, fits_head), fitted, cfg, means, centred_clip, feedback, qa_clip)
    errors = {name: {} for name in METHODS}

    n_sink = cfg.cache.sink_tokens

    def eval_sink(layer, q, k, v):
        out_ref = reference_attention(q, k, v, dtype=torch.float32)
        for name in METHODS:
            # The cache keeps the first sink_tokens in BF16 for every method: one sink token with a
            # 10-100× key norm would otherwise dominate every error (measured: naive INT2 > 100%).
            k_hat, v_hat = quantisers[name](layer, k[n_sink:], v[n_sink:])
            k_hat = torch.cat([k[:n_sink].double(), k_hat])
            v_hat = torch.cat([v[:n_sink].double(), v_hat])
            errors[name].setdefault(layer, ErrorSums()).add(q, k, v, k_hat, v_hat, out_ref)

    log(f"evaluating {len(METHODS)} quantisers on {len(evals)}×{cfg.seq_len} tokens of {cfg.eval_book}")
    run_sequences(model, evals, eval_sink)
    return QualityResult(cfg, geom.n_layers, geom.head_dim,
                         {"fit": len(fit_seqs) * cfg.seq_len, "clip_fit": len(clip_seqs) * cfg.seq_len,
                          "eval": len(evals) * cfg.seq_len},
                         errors, {"k": fitted[0], "v": fitted[1], "k_centred": centred_clip[0],
                                  "v_centred": centred_clip[1], "k_query_aware": qa_clip[0]}, time.time() - t0)
