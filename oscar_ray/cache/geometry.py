"""Page geometry, the page-kind rule and byte accounting of the mixed BF16 / INT2 KV cache.

One page holds `page_size` consecutive token positions for every layer, KV head, K and V. Tensor
shapes per layer and per K or V tensor (see the `*_shape` methods):

    INT2 codes   uint8     [page, token, kv_head, head_dim / 4]   4 two-bit codes per byte
    INT2 scales  fp16|fp32 [page, token, kv_head, 2 * groups]     one scale + one zero per group
    BF16         bf16      [page, token, kv_head, head_dim]

`head_major` keeps those shapes but stores the INT2 tensors [page, kv_head, token, ...] in memory, so
one KV head's rows of a page are contiguous (256 B of codes at page 8, d 128): the kernels read
either through strides; the bytes are the same.

Anchor, head_dim 128, one group, per token, KV head and layer: K codes 32 B + scale/zero 4 B (fp16)
= 36 B, K+V = 72 B against 2 * 128 * 2 = 512 B in BF16, 7.1x smaller; fp32 scales give 80 B, 6.4x.
With `key_bits` 3 the key codes carry one more bit plane (head_dim / 8 bytes): K 52 B + V 36 B = 88 B,
5.8x (d 64: 28 + 20 = 48 B against 256 B, 5.3x; INT2 keys 40 B, 6.4x).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from oscar_ray._defaults import KEY_BITS
from oscar_ray.cache.records import PageKind

BF16_BYTES = 2  # bytes per BF16 element
CODES_PER_BYTE = 4  # 2-bit codes packed 4 per uint8
KV = 2  # one K and one V tensor per layer


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Cost:
    """Bytes under BF16 and under OSCAR; `compression` = bf16 / oscar."""

    bf16: float
    oscar: float

    @property
    def compression(self) -> float:
        return self.bf16 / self.oscar


@dataclass(frozen=True, slots=True)
class Fit:
    """Tokens of one sequence that fit a byte budget under BF16 and OSCAR; `gain` = oscar / bf16."""

    bf16: int
    oscar: int

    @property
    def gain(self) -> float:
        return self.oscar / self.bf16 if self.bf16 else float("inf")


@dataclass(frozen=True, slots=True)
class PageGeometry:
    """Immutable page layout of one model's KV cache.

    `group_size` None means one quantization group per head (`group_size == head_dim`); it is
    resolved in `__post_init__`, so two equal geometries compare equal. `sink_tokens` and
    `recent_tokens` must be whole pages because the allocator moves whole pages between pools.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    page_size: int
    group_size: int | None = None
    scale_bytes: int = 2
    sink_tokens: int = 64  # attention sinks: the first tokens carry most of the softmax mass
    recent_tokens: int = 256  # the window decode attends to most
    key_bits: int = 2  # 3: keys get a third bit plane (needle retrieval, see quality_engine_smollm2.md)
    head_major: bool = False  # INT2 pages' memory order (module docstring); no byte changes

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_kv_heads", "head_dim", "page_size"):
            _positive_int(name, getattr(self, name))
        if self.head_dim % CODES_PER_BYTE:
            raise ValueError(f"head_dim must be divisible by 4, got {self.head_dim}")
        if self.group_size is None:
            object.__setattr__(self, "group_size", self.head_dim)  # frozen: set once, here only
        _positive_int("group_size", self.group_size)
        if self.head_dim % self.group_size:
            raise ValueError(f"group_size={self.group_size} must divide head_dim={self.head_dim}")
        if isinstance(self.key_bits, bool) or self.key_bits not in KEY_BITS:
            raise ValueError(f"key_bits must be one of {KEY_BITS}, got {self.key_bits!r}")
        if self.key_bits == 3 and self.head_dim % 8:
            raise ValueError(f"key_bits=3 needs head_dim divisible by 8, got {self.head_dim}")
        if not isinstance(self.head_major, bool):
            raise ValueError(f"head_major must be a bool, got {self.head_major!r}")
        if self.scale_bytes not in (2, 4):
            raise ValueError(f"scale_bytes must be 2 (fp16) or 4 (fp32), got {self.scale_bytes!r}")
        for name in ("sink_tokens", "recent_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
            if value % self.page_size:
                raise ValueError(
                    f"{name}={value} must be a multiple of page_size={self.page_size} (0 allowed)"
                )

    # --- shapes (per layer, per K or V tensor) -------------------------------------------------
    @property
    def groups(self) -> int:
        return self.head_dim // self.group_size

    def int2_code_shape(self, num_pages: int) -> tuple[int, int, int, int]:
        """Value codes (and key codes at key_bits 2)."""
        return (num_pages, self.page_size, self.n_kv_heads, self.head_dim // CODES_PER_BYTE)

    def key_code_shape(self, num_pages: int) -> tuple[int, int, int, int]:
        return (num_pages, self.page_size, self.n_kv_heads, self.head_dim * self.key_bits // 8)

    def int2_scale_shape(self, num_pages: int) -> tuple[int, int, int, int]:
        return (num_pages, self.page_size, self.n_kv_heads, 2 * self.groups)

    def bf16_shape(self, num_pages: int) -> tuple[int, int, int, int]:
        return (num_pages, self.page_size, self.n_kv_heads, self.head_dim)

    # --- page-kind rule ------------------------------------------------------------------------
    @property
    def sink_pages(self) -> int:
        return self.sink_tokens // self.page_size

    @property
    def recent_pages(self) -> int:
        return self.recent_tokens // self.page_size

    def n_pages(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    def n_history_pages(self, n_tokens: int) -> int:
        """INT2 pages a request of `n_tokens` needs at least: full pages beyond sink + recent."""
        return max(0, n_tokens // self.page_size - self.recent_pages - self.sink_pages)

    def page_kind(self, page_index: int, n_history_pages: int) -> PageKind:
        """Kind of page `page_index` when the request has `n_history_pages` INT2 pages."""
        if self.sink_pages <= page_index < self.sink_pages + n_history_pages:
            return PageKind.INT2
        return PageKind.BF16

    def layout(self, n_tokens: int) -> list[PageKind]:
        """Page kinds of a request that computed all its `n_tokens` itself, in position order."""
        history = self.n_history_pages(n_tokens)
        return [self.page_kind(j, history) for j in range(self.n_pages(n_tokens))]

    # --- bytes (all layers, K and V) -----------------------------------------------------------
    def bf16_token_bytes(self) -> int:
        return self.n_layers * self.n_kv_heads * KV * self.head_dim * BF16_BYTES

    def int2_token_bytes(self) -> int:
        scales = 2 * self.groups * self.scale_bytes
        per_head = self.head_dim * self.key_bits // 8 + self.head_dim // CODES_PER_BYTE + KV * scales
        return self.n_layers * self.n_kv_heads * per_head

    def bf16_page_bytes(self) -> int:
        return self.page_size * self.bf16_token_bytes()

    def int2_page_bytes(self) -> int:
        return self.page_size * self.int2_token_bytes()

    def context_bytes(self, context_len: int) -> Cost:
        """KV bytes of one sequence; OSCAR keeps the first sink and last recent tokens BF16.

        Token-exact (ignores the partly filled tail page, at most page_size - 1 extra BF16 tokens).
        """
        _positive_int("context_len", context_len)
        bf16_tokens = min(context_len, self.sink_tokens + self.recent_tokens)
        oscar = bf16_tokens * self.bf16_token_bytes()
        oscar += (context_len - bf16_tokens) * self.int2_token_bytes()
        return Cost(bf16=context_len * self.bf16_token_bytes(), oscar=oscar)

    def bytes_per_token(self, context_len: int) -> Cost:
        total = self.context_bytes(context_len)
        return Cost(bf16=total.bf16 / context_len, oscar=total.oscar / context_len)

    def tokens_that_fit(self, budget_bytes: int) -> Fit:
        """Longest single sequence whose KV fits `budget_bytes` (token-exact as context_bytes)."""
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
        bf16, int2 = self.bf16_token_bytes(), self.int2_token_bytes()
        window = self.sink_tokens + self.recent_tokens
        if budget_bytes < window * bf16:  # the budget ends inside the BF16 window
            oscar = budget_bytes // bf16
        else:
            oscar = window + (budget_bytes - window * bf16) // int2
        return Fit(bf16=budget_bytes // bf16, oscar=oscar)


# Published configs (config.json of each model): layers, KV heads, head_dim.
REFERENCE_MODELS: dict[str, tuple[int, int, int]] = {
    "SmolLM2-135M": (30, 3, 64),
    "Qwen3-8B": (36, 8, 128),
    "GLM-4.7": (92, 8, 128),
}


def reference_geometries(page_size: int = 64) -> list[tuple[str, PageGeometry]]:
    """The REFERENCE_MODELS with fp16 and fp32 scales, defaults for sink and recent tokens."""
    return [
        (name, PageGeometry(layers, heads, dim, page_size, scale_bytes=scale))
        for name, (layers, heads, dim) in REFERENCE_MODELS.items()
        for scale in (2, 4)
    ]


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f}"


def format_capacity_table(
    geometries: Iterable[tuple[str, PageGeometry]],
    budget_bytes: int,
    contexts: Sequence[int] = (32 * 1024, 128 * 1024),
) -> str:
    """Markdown table: per (model, scale width, context) the KV bytes of one sequence, the
    compression, and how many such sequences fit `budget_bytes` under BF16 and OSCAR."""
    budget = f"{budget_bytes / 2**30:g} GiB"
    lines = [
        f"| model | scales | context | BF16 GiB/seq | OSCAR GiB/seq | compression"
        f" | seqs in {budget} BF16 | seqs OSCAR | max tokens BF16 | max tokens OSCAR |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, geom in geometries:
        fit = geom.tokens_that_fit(budget_bytes)
        for context in contexts:
            cost = geom.context_bytes(context)
            lines.append(
                f"| {name} | fp{8 * geom.scale_bytes} | {context // 1024}K"
                f" | {_gib(cost.bf16)} | {_gib(cost.oscar)} | {cost.compression:.2f}x"
                f" | {budget_bytes // cost.bf16:.0f} | {budget_bytes // cost.oscar:.0f}"
                f" | {fit.bf16:,} | {fit.oscar:,} |"
            )
    return "\n".join(lines)
