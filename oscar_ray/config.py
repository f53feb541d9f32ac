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

    @model_validator(mode="after")
    def _whole_pages(self):
        for name in ("sink_tokens", "recent_tokens"):
            if getattr(self, name) % self.page_size:
                raise ValueError(f"{name} ({getattr(self, name)}) must be a multiple of page_size ({self.page_size})")
        if self.group_size is not None and self.group_size & (self.group_size - 1):
            raise ValueError(f"group_size ({self.group_size}) must be a power of two")
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
