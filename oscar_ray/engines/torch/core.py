"""The synchronous engine core: model + paged cache + scheduler; one `step()` is one forward.

Threading: `step()`, `add()`, `abort()` and `score()` mutate the allocator and must run on one
thread at a time; `EngineCore.lock` serialises them (the async engine's loop thread holds it per
step, `score()` takes it too).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch

from oscar_ray.cache import KVAllocator, PageGeometry
from oscar_ray.models.absorb import absorb_value_rotation
from oscar_ray.models.arch import arch_facts
from oscar_ray.models.loader import attention_geometry, load_model
from oscar_ray.models.rotations import hadamard_rotations, resolve_rotations

from .batch import StepBatch, StepItem, register_attention
from .config import TorchEngineConfig
from .kvstore import KVStore
from .scheduler import Plan, Scheduler, Seq

log = logging.getLogger(__name__)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class StepResult:
    """What one step produced: (seq, sampled token) for every sequence that got logits."""

    sampled: list[tuple[Seq, torch.Tensor]]
    plan: Plan


def pool_sizes(cfg: TorchEngineConfig, geom: PageGeometry) -> tuple[int, int]:
    """(INT2 pages, BF16 pages) from explicit counts or the byte budget (see config.py)."""
    if cfg.kv_cache == "bf16":
        n16 = cfg.num_bf16_pages or max(1, cfg.kv_cache_bytes // geom.bf16_page_bytes())
        return 0, n16
    window = geom.sink_pages + geom.recent_pages + 1  # BF16 pages one long sequence holds at most
    n16 = cfg.num_bf16_pages or cfg.max_num_seqs * window
    if cfg.num_int2_pages is not None:
        return cfg.num_int2_pages, n16
    left = cfg.kv_cache_bytes - n16 * geom.bf16_page_bytes()
    return max(0, left // geom.int2_page_bytes()), n16


def engine_rotations(model, tokenizer, rotations: str | None, k_clip: float, v_clip: float, mode: str = "best",
                     sink_tokens: int = 64):
    """The RotationSet for `TorchEngineConfig.rotations`: the two named baselines (same INT2 format,
    clip and windows as OSCAR, only the basis differs) or an artifact / the quick calibration."""
    if rotations == "hadamard":
        return hadamard_rotations(model, k_clip, v_clip)
    if rotations == "identity":
        rs = hadamard_rotations(model, k_clip, v_clip)
        eye = torch.eye(rs.k_rotation.shape[-1]).expand_as(rs.k_rotation)
        rs.k_rotation, rs.v_rotation = eye.contiguous(), eye.contiguous()
        rs.manifest = {**rs.manifest, "objective": "identity"}
        return rs
    return resolve_rotations(model, tokenizer, rotations, k_clip, v_clip, mode=mode, sink_tokens=sink_tokens)


class EngineCore:
    """Model, cache tensors, allocator and scheduler of the torch engine (synchronous)."""

    def __init__(self, cfg: TorchEngineConfig, model=None, tokenizer=None) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device is 'cuda' but torch sees no CUDA device; use device: cpu")
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        if model is None:
            model, tokenizer = load_model(cfg.model, dtype=_DTYPES[cfg.dtype])
        self.tokenizer = tokenizer
        arch_facts(model.config)  # refuse a family whose attention layout is unchecked
        g = attention_geometry(model.config)
        self.attn = g
        c = cfg.cache
        oscar = cfg.kv_cache == "oscar"
        if oscar:
            rs = engine_rotations(model, tokenizer, cfg.rotations, c.k_clip_ratio, c.v_clip_ratio,
                                  cfg.quick_calibration, c.sink_tokens)
            # a model passed in may already sit on the GPU; rotations load on the CPU
            absorb_value_rotation(model, rs.v_rotation.to(next(model.parameters()).device))
            self.rotations = rs
            self.k_rotation = rs.k_rotation.to(self.device, torch.float32)
            self.means = None if not rs.centred else (rs.k_mean.to(self.device),
                                                      rs.value_mean_rotated().to(self.device))
            k_clip, v_clip = rs.k_clip, rs.v_clip
            if c.key_bits == 3:
                # the fitted ratios are for 4 levels; at 8 levels clipping removes the large components
                # that make a key stand out (scratch needle sweep: clipped 4/10 vs unclipped 7/10 at g32)
                k_clip = torch.zeros_like(k_clip)
            sink, recent = c.sink_tokens, c.recent_tokens
        else:
            self.rotations, self.k_rotation, self.means = None, None, None
            k_clip = v_clip = torch.zeros(g.n_layers)
            # every page BF16: a recent window longer than any sequence means no history pages
            sink, recent = 0, -(-cfg.max_model_len // c.page_size) * c.page_size
        self.geometry = PageGeometry(g.n_layers, g.n_kv_heads, g.head_dim, c.page_size,
                                     group_size=c.group_size, scale_bytes=2 if c.scale_dtype == "float16" else 4,
                                     sink_tokens=sink, recent_tokens=recent, key_bits=c.key_bits if oscar else 2,
                                     head_major=c.page_layout == "head")
        n2, n16 = pool_sizes(cfg, self.geometry)
        self.allocator = KVAllocator(self.geometry, n2, n16)
        self.store = KVStore(self.geometry, n2, n16, self.device, c.scale_dtype, k_clip, v_clip)
        self.scheduler = Scheduler(self.allocator, cfg.max_num_seqs, cfg.max_batched_tokens, cfg.prefix_caching)
        if not self.scheduler.fits_alone(cfg.max_model_len):
            raise ValueError(f"kv pools ({n2} INT2 + {n16} BF16 pages of {c.page_size} tokens) cannot hold one "
                             f"sequence of max_model_len={cfg.max_model_len}: raise kv_cache_bytes or the page counts")
        model.to(self.device)
        model.set_attn_implementation(register_attention())
        self.model = model
        self.lock = threading.RLock()
        log.info("torch engine: %s, kv_cache=%s, %d INT2 + %d BF16 pages (%.0f MiB)", cfg.model, cfg.kv_cache,
                 n2, n16, self.store.nbytes() / 2**20)

    # --- the forward ---------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, items: list[StepItem], tokens: torch.Tensor, logit_rows: torch.Tensor) -> torch.Tensor:
        """tokens [N] of the packed items → logits [len(logit_rows), V] float32."""
        batch = StepBatch(self.store, items, self.k_rotation, self.means)
        out = self.model.model(input_ids=tokens[None].to(self.device), position_ids=batch.positions[None],
                               use_cache=False, oscar_step=batch)
        hidden = out.last_hidden_state[0, logit_rows.to(self.device)]
        return self.model.lm_head(hidden).float()

    def step(self) -> StepResult:
        """Schedule, move pages, run one forward, return the sampled-row logits (caller samples).
        The caller must call `finish_step()` after handling the result."""
        plan = self.scheduler.schedule()
        self.store.demote(plan.demotions)
        self.store.copy(plan.copies)
        if not plan.items:
            return StepResult([], plan)
        toks, rows, need = [], [], []
        lo = 0
        for seq, it in plan.items:
            toks += seq.tokens[it.start:it.start + it.n_new]
            lo += it.n_new
            if it.start + it.n_new == len(seq.tokens):  # this chunk ends the known tokens: sample
                rows.append(lo - 1)
                need.append(seq)
            if it.write:
                seq.n_written = it.start + it.n_new
        logits = self.forward([it for _, it in plan.items], torch.tensor(toks, dtype=torch.long),
                              torch.tensor(rows, dtype=torch.long))
        return StepResult(list(zip(need, logits)), plan)

    def finish_step(self, finished: list[Seq], prompts_done: list[Seq]) -> None:
        """End the allocator step, cache the prefixes of prompts done and finished sequences,
        free the finished."""
        self.allocator.end_step()
        if self.cfg.prefix_caching:
            for seq in prompts_done:
                if seq.allocated and not seq.finished:
                    self.allocator.insert_prefix(seq.key, seq.tokens[:seq.n_prompt])
        for seq in finished:
            if seq.allocated and self.cfg.prefix_caching:
                self.allocator.insert_prefix(seq.key, seq.tokens[:seq.n_written])
            self.scheduler.drop(seq)

    # --- scoring (for evaluation scripts, not the serving path) --------------------------------
    @torch.inference_mode()
    def score(self, token_ids: list[int], chunk: int | None = None) -> torch.Tensor:
        """Log-probabilities [T-1] (float32, CPU) of token_ids[1:] given their prefixes, computed by
        chunked prefill through the same paged cache (so later chunks read INT2 history exactly as
        serving does). The pools must hold the whole sequence; the engine loop pauses meanwhile.

        Example: nll = -core.score(tok(text)["input_ids"]).mean()   # perplexity = exp(nll)
        """
        ids = [int(t) for t in token_ids]
        if len(ids) < 2:
            raise ValueError("token_ids must hold at least 2 tokens to score")
        chunk = chunk or self.cfg.max_batched_tokens
        key = ("score", id(ids))
        with self.lock:
            if not self.scheduler.fits_alone(len(ids)):
                raise ValueError(f"token_ids has {len(ids)} tokens; the kv pools cannot hold them")
            self.allocator.allocate(key, len(ids))
            out = []
            try:
                for lo in range(0, len(ids), chunk):
                    hi = min(lo + chunk, len(ids))
                    item = StepItem(key, self.allocator.segments(key), lo, hi - lo)
                    logits = self.forward([item], torch.tensor(ids[lo:hi]), torch.arange(hi - lo))
                    lp = torch.log_softmax(logits, -1).cpu()
                    tgt = torch.tensor(ids[lo + 1:hi + 1])
                    out.append(lp[: tgt.numel()].gather(1, tgt[:, None])[:, 0])
                    self.allocator.end_step()
            finally:
                self.allocator.end_step()
                self.allocator.free(key)
        return torch.cat(out)
