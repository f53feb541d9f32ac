"""Pydantic models for every YAML surface (extra="forbid": a typo is an error, not a silent default).

Numbers shared with the torch-only layers come from `oscar_ray._defaults`, so the GPU image (no
pydantic) and the configs agree.  Each YAML in configs/ maps onto one model via `from_file()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import _defaults as D


class StrictModel(BaseModel):
    """Base of every config: unknown keys are rejected, models are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def from_file(cls, path: str | Path):
        """Load and validate a YAML file; errors name the offending field."""
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"config file not found: {p}")
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{p}: top level must be a mapping, got {type(data).__name__}")
        return cls.model_validate(data)


class OscarCacheConfig(StrictModel):
    """The OSCAR mixed-precision KV cache: BF16 sink + INT2 history + BF16 recent window."""

    sink_tokens: int = Field(D.SINK_TOKENS, ge=0, description="First tokens kept in BF16 (attention sinks).")
    recent_tokens: int = Field(D.RECENT_TOKENS, ge=0, description="Last tokens kept in BF16 (recent window).")
    group_size: int | None = Field(
        None, ge=4, description="Elements per (scale, zero) pair along head_dim; None = head_dim (one pair per row)."
    )
    scale_dtype: Literal["float16", "float32"] = Field(
        D.SCALE_DTYPE, description="Storage dtype of scale/zero: float16 = 2.25 bits/element at d=128, float32 = 2.5."
    )
    k_clip_ratio: float = Field(D.K_CLIP_RATIO, ge=0.0, le=1.0, description="Per-token key clip quantile (0 = off).")
    v_clip_ratio: float = Field(D.V_CLIP_RATIO, ge=0.0, le=1.0, description="Per-token value clip quantile (0 = off).")
    page_size: int = Field(D.PAGE_SIZE, ge=1, description="Tokens per KV page; sink and recent are whole pages.")
    lloyd_max: bool = Field(False, description="Gaussian Lloyd-Max levels instead of uniform min-max (experimental).")
    key_bits: Literal[2, 3] = Field(
        2, description="Bits per key element in the history tier: 2 (INT2), or 3 (one more bit plane, d/8 bytes a "
        "row; keys then stored unclipped). Values stay INT2. SmolLM2 needles: 8/36 at 2, see "
        "benchmarks/results/quality_engine_smollm2.md for 3.")
    page_layout: Literal["token", "head"] = Field(
        D.PAGE_LAYOUT, description="Memory order of the INT2 pages: head (default: a KV head's rows of a page together, "
        "one 256-B run a page at d 128) or token (a token's rows of all KV heads together); same shapes and bytes, "
        "every kernel reads either. head: decode 1.50x faster on an H100 at bs 8 x 128K (240.6 vs 361.9 us: "
        "token-major pages hold the CUDA tier at the L2's throughput), benchmarks/results/decode_h200.md.")

    @model_validator(mode="after")
    def _whole_pages(self):
        for name in ("sink_tokens", "recent_tokens"):
            if getattr(self, name) % self.page_size:
                raise ValueError(f"{name} ({getattr(self, name)}) must be a multiple of page_size ({self.page_size})")
        if self.group_size is not None and self.group_size & (self.group_size - 1):
            raise ValueError(f"group_size ({self.group_size}) must be a power of two")
        if self.key_bits == 3 and self.lloyd_max:
            raise ValueError("lloyd_max is a 4-level quantiser: it needs key_bits 2")
        return self

    def resolved_group_size(self, head_dim: int) -> int:
        gs = self.group_size or head_dim
        if head_dim % gs:
            raise ValueError(f"group_size ({gs}) must divide head_dim ({head_dim})")
        return gs


class QualityConfig(StrictModel):
    """`oscar-ray quality`: fit OSCAR on captured activations of a real model and compare quantisers."""

    model: str = Field("smollm2", description="'smollm2' (the fetched GGUF) or a GGUF file / HF model directory.")
    calib_book: str = Field("emma", description="Austen novel the rotations are fitted on.")
    eval_book: str = Field("persuasion", description="Austen novel for held-out evaluation (another book).")
    seq_len: int = Field(1024, ge=16, le=8192, description="Tokens per captured sequence (SmolLM2 context is 8192).")
    calib_seqs: int = Field(6, ge=1, description="Sequences for the rotation fit.")
    clipfit_seqs: int = Field(1, ge=0, description="Further calibration sequences held out for the clip-ratio fit.")
    eval_seqs: int = Field(2, ge=1, description="Sequences of the evaluation book.")
    cache: OscarCacheConfig = Field(default_factory=OscarCacheConfig, description="Quantiser settings.")
    output_dir: str = Field("benchmarks/results", description="Where the markdown table and PNG go.")
    name: str = Field("quality_smollm2", description="Stem of the output files.")


class CalibDataConfig(StrictModel):
    """Where calibration tokens come from (deterministic order, sharded round-robin over workers)."""

    source: Literal["austen", "files", "chat"] = Field(
        "austen", description="austen: the fetched novels; files: .txt/.jsonl paths; chat: jsonl of messages rendered "
        "with the model's chat template.")
    books: list[str] = Field(default_factory=lambda: ["emma", "prideprejudice", "mansfieldpark"],
                             description="Austen novels, in order (source=austen).")
    paths: list[str] = Field(default_factory=list, description="Text (.txt) or JSON-lines (.jsonl) files (source=files/chat).")
    text_field: str = Field("text", description="JSON-lines field holding the text (source=files).")


class CalibOutputConfig(StrictModel):
    path: str = Field("artifacts/rotations", description="Directory the RotationSet is written to.")
    modelscope_id: str | None = Field(None, description="Publish to this ModelScope repo (needs MODELSCOPE_API_TOKEN).")
    overwrite: bool = Field(False, description="Replace an existing artifact of another model at `path`.")


class ModelFacts(StrictModel):
    """Architecture numbers for `--dry-run` when the model's files are not on this machine."""

    n_layers: int = Field(..., ge=1, description="Decoder layers.")
    n_q_heads: int = Field(..., ge=1, description="Query heads.")
    n_kv_heads: int = Field(..., ge=1, description="KV heads.")
    head_dim: int = Field(..., ge=4, description="Head dimension.")
    n_params_b: float = Field(..., gt=0, description="Parameters, billions (weights memory).")
    bytes_per_param: float = Field(2.0, gt=0, description="1 for FP8 checkpoints, 2 for BF16.")
    architecture: str = Field("unknown", description="transformers architecture name.")


class CalibrationConfig(StrictModel):
    """`oscar-ray calibrate` / `python -m oscar_ray.calib_jobs.calibrate`: a distributed OSCAR calibration."""

    model: str = Field("smollm2", description="'smollm2', a GGUF file or an HF model directory.")
    model_id: str = Field("HuggingFaceTB/SmolLM2-135M-Instruct", description="Name recorded in the artifact manifest.")
    data: CalibDataConfig = Field(default_factory=CalibDataConfig, description="Calibration text.")
    token_budget: int = Field(D.CALIB_TOKENS_PER_LAYER, ge=1, description="Tokens per layer for the rotation fit.")
    clipfit_tokens: int = Field(2048, ge=0, description="Further held-out tokens for the clip fit (clip_mode=fit).")
    chunk_len: int = Field(1024, ge=16, description="Tokens per forward pass (one sequence).")
    workers: int = Field(2, ge=1, description="Ray actors, one model replica each (data parallel).")
    gpus_per_worker: int = Field(0, ge=0, description="GPUs per actor = TP size of one replica; 0 = CPU.")
    cpus_per_worker: int = Field(1, ge=1, description="CPUs per actor (torch threads).")
    value_target: Literal["diag", "softmax"] = Field("diag", description="diag: authors' proxy; softmax: exact VᵀSᵀSV.")
    clip_mode: Literal["fixed", "fit"] = Field("fixed", description="fixed ratios or a per-layer fit on held-out tokens.")
    composition: Literal["r_h_pbr", "r_h", "plain", "hadamard"] = Field("r_h_pbr", description="R = U·H·P by default.")
    per_kv_head: bool = Field(False, description="One rotation per KV head instead of per layer.")
    centre: bool = Field(True, description="Store per-KV-head key/value channel means; the cache subtracts them "
                         "before INT2 (exact under softmax; SmolLM2 attention-output error 0.48 → 0.37).")
    cache: OscarCacheConfig = Field(default_factory=OscarCacheConfig, description="Clip ratios, group size, scales.")
    checkpoint_dir: str | None = Field(None, description="Partial sums are saved here; default <output.path>/.ckpt.")
    checkpoint_every: int = Field(2, ge=1, description="Chunks between checkpoints of a worker's partial sums.")
    max_worker_restarts: int = Field(3, ge=0, description="How often Ray replaces a dead worker before failing.")
    output: CalibOutputConfig = Field(default_factory=CalibOutputConfig, description="Artifact destination.")
    model_facts: ModelFacts | None = Field(None, description="For --dry-run of a model whose files are absent.")
    measured_tokens_per_s: float | None = Field(None, gt=0, description="Per-worker throughput used by --dry-run.")
