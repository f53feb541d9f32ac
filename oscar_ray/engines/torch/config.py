"""Config of the torch reference engine (one pydantic model, the `engine.config` of a Serve app).

Defaults are sized for the CPU default (SmolLM2-135M on 2 cores): 2048-token context, 16 running
sequences, 256-token prefill chunks, and a 256 MiB KV budget. At SmolLM2's geometry (30 layers,
3 KV heads, d 64, page 64) a BF16 page is 1.41 MiB and an INT2 page (fp16 scales) 0.22 MiB; the
budget first gives every running sequence its BF16 window (sink 1 + recent 4 + tail 1 = 6 pages,
16 × 6 = 96 pages, 135 MiB), the rest goes to INT2 (~540 pages, 34K history tokens).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from oscar_ray.config import OscarCacheConfig, StrictModel


class TorchEngineConfig(StrictModel):
    """The torch reference engine: a transformers model whose attention reads the paged OSCAR cache."""

    model: str = Field("smollm2", description="'smollm2' (the fetched GGUF), a GGUF file or an HF model directory.")
    name: str | None = Field(None, description="Model name reported by model_info (default: `model`).")
    kv_cache: Literal["oscar", "bf16"] = Field(
        "oscar", description="oscar: BF16 sink + INT2 history + BF16 recent ring; bf16: every page BF16 (baseline).")
    rotations: str | None = Field(
        None, description="RotationSet artifact directory; None: a quick calibration on Austen text, cached "
        "under OSCAR_CACHE_DIR/rotations (Hadamard if the text cannot be fetched); 'hadamard': data-free "
        "Hadamard R_K = R_V = H (the QuaRot-INT2 baseline); 'identity': no rotation (naive INT2). Both "
        "baselines keep the INT2 format, clip ratios and sink/recent windows. Ignored for kv_cache=bf16.")
    quick_calibration: Literal["best", "authors"] = Field(
        "best", description="The calibration run when `rotations` is None. best: per-KV-head rotations, centred "
        "keys/values, per-layer fitted clip ratios (SmolLM2 attention-output error 0.38); authors: the paper's "
        "per-layer rotations and the fixed clip ratios of `cache` (0.67).")
    max_model_len: int = Field(2048, ge=16, description="Longest prompt + completion, tokens.")
    kv_cache_bytes: int = Field(256 * 2**20, ge=1, description="KV memory budget (both pools) when page counts "
                                "are not given.")
    num_bf16_pages: int | None = Field(None, ge=1, description="BF16 pool size in pages (overrides the budget split).")
    num_int2_pages: int | None = Field(None, ge=0, description="INT2 pool size in pages (overrides the budget split).")
    max_num_seqs: int = Field(16, ge=1, description="Running sequences per step (decode batch).")
    max_batched_tokens: int = Field(256, ge=1, description="Tokens per step: decodes plus prefill chunks.")
    max_queue: int = Field(256, ge=0, description="Waiting requests; one more raises EngineOverloaded (HTTP 429).")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu: torch reference ops; cuda: the Triton kernels.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Model weights/activations (CPU: float32 is the fast path; CUDA: bfloat16).")
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads (default OSCAR_NUM_THREADS "
                                    "or torch's own).")
    prefix_caching: bool = Field(True, description="Reuse cached prompt pages by block hash.")
    cache: OscarCacheConfig = Field(default_factory=OscarCacheConfig,
                                    description="Sink/recent windows, page size, scale dtype, clip ratios.")

    @model_validator(mode="after")
    def _pools(self):
        if self.kv_cache == "bf16" and self.num_int2_pages:
            raise ValueError("num_int2_pages must be 0 or unset when kv_cache is 'bf16' (every page is BF16)")
        return self
