"""The plugin's settings as every sglang process sees them: OSCAR_* environment variables.

sglang 0.5.23 starts its schedulers (one per TP rank) and its detokenizer with
`mp.set_start_method("spawn")`, so nothing set in the launching process survives except the
environment; `sglang.srt.plugins.load_plugins()` then runs our entry point in each child.  The
settings are therefore read from the environment (oscar_ray.env.SGLANG_ENV), validated once per
process, and turned into the same PageGeometry the engine-agnostic cache uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from oscar_ray import _defaults as D
from oscar_ray.cache.geometry import PageGeometry
from oscar_ray.env import SGLANG_ENV, sglang_plugin_env

IDENTITY = "identity"  # OSCAR_ROTATIONS value for plain INT2 without rotations (the naive baseline)
SCALE_BYTES = {"float16": 2, "float32": 4}


@dataclass(frozen=True, slots=True)
class OscarSettings:
    """What the OSCAR pool, backend and weight hook need besides sglang's own server args.

    rotations: a RotationSet directory, or IDENTITY.  k_clip / v_clip None: use the artifact's
    per-layer ratios (identity: the defaults 0.96 / 0.92).  absorb_v: fold R_V into W_v / W_o
    at weight load (no runtime o·R_Vᵀ); False rotates V in the write kernel and un-rotates the
    attention output instead.  key_bits 3: 3-bit keys (PageGeometry.key_bits), stored unclipped
    unless k_clip is set, as the torch engine does.  page_layout: the INT2 pages' memory order
    (PageGeometry.head_major for "head").
    """

    rotations: str
    sink_tokens: int = D.SINK_TOKENS
    recent_tokens: int = D.RECENT_TOKENS
    scale_dtype: str = D.SCALE_DTYPE
    group_size: int | None = None
    k_clip: float | None = None
    v_clip: float | None = None
    absorb_v: bool = True
    key_bits: int = 2
    page_layout: str = D.PAGE_LAYOUT

    def __post_init__(self) -> None:
        if self.key_bits not in D.KEY_BITS:
            raise ValueError(f"{SGLANG_ENV['key_bits']} must be one of {D.KEY_BITS}, got {self.key_bits}")
        if not self.rotations:
            raise ValueError(f"{SGLANG_ENV['rotations']} is required: a RotationSet directory or "
                             f"'{IDENTITY}' for plain INT2 without rotations")
        if self.page_layout not in ("token", "head"):
            raise ValueError(f"{SGLANG_ENV['page_layout']} must be token or head, got {self.page_layout!r}")
        if self.scale_dtype not in SCALE_BYTES:
            raise ValueError(f"{SGLANG_ENV['scale_dtype']} must be float16 or float32, got {self.scale_dtype!r}")
        for name in ("sink_tokens", "recent_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{SGLANG_ENV[name]} must be >= 0, got {getattr(self, name)}")
        for name in ("k_clip", "v_clip"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{SGLANG_ENV[name]} must lie in [0, 1], got {value}")

    @classmethod
    def from_env(cls, environ=None) -> "OscarSettings":
        """Read OSCAR_* (unset ones keep the defaults); ValueError names the bad variable."""
        raw = {k: v for k, v in sglang_plugin_env(environ).items() if v is not None}
        return cls(**{"rotations": "", **raw})

    def to_env(self) -> dict[str, str]:
        """The OSCAR_* variables that reproduce these settings in another process."""
        out = {SGLANG_ENV["rotations"]: self.rotations, SGLANG_ENV["sink_tokens"]: str(self.sink_tokens),
               SGLANG_ENV["recent_tokens"]: str(self.recent_tokens), SGLANG_ENV["scale_dtype"]: self.scale_dtype,
               SGLANG_ENV["absorb_v"]: "1" if self.absorb_v else "0", SGLANG_ENV["key_bits"]: str(self.key_bits),
               SGLANG_ENV["page_layout"]: self.page_layout}
        for name in ("group_size", "k_clip", "v_clip"):
            if getattr(self, name) is not None:
                out[SGLANG_ENV[name]] = str(getattr(self, name))
        return out

    @property
    def key_clip(self) -> float | None:
        """The key clip override: k_clip, else none at all for 3-bit keys (the artifact's per-layer
        ratios are fitted for 4 levels), else None (the artifact's)."""
        if self.k_clip is not None or self.key_bits == 2:
            return self.k_clip
        return 0.0

    @property
    def identity(self) -> bool:
        return self.rotations == IDENTITY

    def geometry(self, n_layers: int, n_kv_heads: int, head_dim: int, page_size: int) -> PageGeometry:
        """PageGeometry of one TP rank's pool: its layers and its KV heads (ValueError if the
        sink / recent windows are not whole pages of sglang's --page-size)."""
        return PageGeometry(n_layers, n_kv_heads, head_dim, page_size, group_size=self.group_size,
                            scale_bytes=SCALE_BYTES[self.scale_dtype], sink_tokens=self.sink_tokens,
                            recent_tokens=self.recent_tokens, key_bits=self.key_bits,
                            head_major=self.page_layout == "head")
