"""Argument checks shared by the kernel launchers: every failure is a ValueError naming the argument."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

FLOAT_ROWS = (torch.bfloat16, torch.float16, torch.float32)
SCALE_DTYPES = (torch.float16, torch.float32)
PRECISIONS = ("ieee", "tf32", "bf16", "fp16")


def check_tensor(
    name: str,
    t: object,
    dtypes: Iterable[torch.dtype],
    shape: Sequence[int | None] | None = None,
    ndim: int | None = None,
    device: torch.device | None = None,
    unit_last_stride: bool = True,
) -> torch.Tensor:
    """`t` is a tensor of one of `dtypes`, with `shape` (None = any size) on `device`; last stride 1."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    want = len(shape) if shape is not None else ndim
    if want is not None and t.ndim != want:
        raise ValueError(f"{name} must be {want}-D, got shape {tuple(t.shape)}")
    if shape is not None:
        for axis, (have, size) in enumerate(zip(t.shape, shape)):
            if size is not None and have != size:
                raise ValueError(f"{name} has size {have} on axis {axis}, expected {size} "
                                 f"(shape {tuple(t.shape)}, expected {tuple(shape)})")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    # the kernels address the innermost axis as a contiguous vector (one load per row)
    if unit_last_stride and t.ndim and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last axis, got strides {t.stride()}")
    return t


def check_pow2(name: str, value: int, minimum: int = 1) -> int:
    """tl.arange needs power-of-two extents, so head_dim, group sizes and blocks must be powers of 2."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {minimum}, got {value!r}")
    return value


def check_positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_precision(precision: str) -> str:
    """The dot-product precision to compile; "bf16" becomes "bf16_interp" under TRITON_INTERPRET=1."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and os.environ.get("TRITON_INTERPRET") == "1":
        return "bf16_interp"  # see _attn_tiles._mm: the interpreter cannot multiply bf16 tensors
    return precision


def code_bytes(head_dim: int, bits: int) -> int:
    """Packed bytes of one row: d/4 for INT2, d/4 + d/8 for 3-bit keys (quant/int2.pack_codes)."""
    return head_dim * bits // 8


def group_count(head_dim: int, group_size: int | None, name: str = "group_size") -> tuple[int, int]:
    """(group_size, n_groups) for one row of head_dim; both powers of two (the tile reshapes need it)."""
    gs = head_dim if group_size is None else group_size
    if not isinstance(gs, int) or gs < 1 or head_dim % gs:
        raise ValueError(f"{name} ({group_size!r}) must divide head_dim ({head_dim})")
    check_pow2(name, gs)
    return gs, head_dim // gs


def check_rotation(name: str, r: torch.Tensor | None, head_dim: int, n_kv_heads: int,
                   device: torch.device) -> torch.Tensor | None:
    """R is fp32 [d, d] (one per layer) or [H_kv, d, d] (one per KV head), row convention x·R."""
    if r is None:
        return None
    check_tensor(name, r, (torch.float32,), device=device, unit_last_stride=False)
    if r.shape not in ((head_dim, head_dim), (n_kv_heads, head_dim, head_dim)):
        raise ValueError(f"{name} must be [{head_dim}, {head_dim}] or [{n_kv_heads}, {head_dim}, {head_dim}], "
                         f"got {tuple(r.shape)}")
    return r.contiguous()


def nonempty_table(table: torch.Tensor) -> torch.Tensor:
    """A [B, 0] page table becomes [B, 1] zeros so the kernels always get a valid (never read) pointer."""
    if table.shape[1] > 0:
        return table
    return torch.zeros(table.shape[0], 1, dtype=table.dtype, device=table.device)
