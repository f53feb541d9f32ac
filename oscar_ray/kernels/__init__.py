"""Triton kernels of the OSCAR mixed INT2 / BF16 KV cache (torch + triton only; see layout.py)."""

from ._interpreter import patch_interpreter
from .decode_attention import default_bf16_splits, default_num_splits, int2_decode_attention
from .demote import demote_pages, demote_pages_kv
from .extend_attention import int2_extend_attention
from .layout import KVGeometry, PagedKV, Segments
from .rotate import NewRows, rotate_qk
from .write import int2_write, int2_write_kv
from .write_bf16 import bf16_write, bf16_write_kv

patch_interpreter()  # CPU interpreter only; see _interpreter.py

__all__ = [
    "KVGeometry", "NewRows", "PagedKV", "Segments", "bf16_write", "bf16_write_kv", "default_bf16_splits", "default_num_splits",
    "demote_pages", "demote_pages_kv", "int2_decode_attention", "int2_extend_attention", "int2_write", "int2_write_kv",
    "rotate_qk",
]
