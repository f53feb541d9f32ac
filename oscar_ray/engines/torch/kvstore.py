"""The tensors behind the allocator's pages, for every layer, and the data moves it asks for.

Per layer (kernels/layout.py), one tensor per kind with a leading layer dimension so that
`paged(l)` is a contiguous view the kernels accept:
    k_codes, v_codes   uint8      [L, n_int2 (≥1), page, H_kv, d/4]  (keys d/4 + d/8 at key_bits 3)
    k_scales, v_scales fp16|fp32  [L, n_int2 (≥1), page, H_kv, 2·G]
    k_bf16, v_bf16     bfloat16   [L, n_bf16, page, H_kv, d]
(codes and scales stored [.., page, H_kv, token, ..] when geometry.head_major; same shapes).
Keys are stored rotated (k·R_K), values rotated by the absorbed W_v, so no rotation happens here.
Writes and moves run the Triton kernels on CUDA and the package's torch references on CPU (the
Triton interpreter is ~10⁴× too slow to serve); both produce the same codes (tested bit-exact in
tests/unit/kernels).
"""

from __future__ import annotations

import torch

from oscar_ray.cache import Demotion, PageCopy, PageGeometry, PageKind
from oscar_ray.kernels.layout import PagedKV, int2_zeros
from oscar_ray.kernels.reference import int2_write_reference
from oscar_ray.quant.int2 import dequantize_int2, scale_dtype_of, unpack_codes


class KVStore:
    """Page tensors of one model's cache and the ops that write, move and read them."""

    def __init__(self, geometry: PageGeometry, n_int2_pages: int, n_bf16_pages: int, device: torch.device,
                 scale_dtype: str, k_clip: torch.Tensor, v_clip: torch.Tensor) -> None:
        g = geometry
        self.geometry, self.device = g, torch.device(device)
        self.cpu = self.device.type == "cpu"
        self.scale_dtype = scale_dtype_of(scale_dtype)
        self.group_size = g.group_size
        n2 = max(1, n_int2_pages)  # the kernels want a real tensor even when the pool is empty
        L, P, H, d = g.n_layers, g.page_size, g.n_kv_heads, g.head_dim
        mk = lambda shape, dt: torch.zeros(shape, dtype=dt, device=self.device)  # noqa: E731
        mk2 = lambda shape, dt: int2_zeros(shape, dt, self.device, g.head_major)  # noqa: E731
        self.key_bits = g.key_bits
        self.k_codes = mk2((L,) + g.key_code_shape(n2), torch.uint8)
        self.v_codes = mk2((L,) + g.int2_code_shape(n2), torch.uint8)
        self.k_scales, self.v_scales = (mk2((L, n2, P, H, 2 * g.groups), self.scale_dtype) for _ in range(2))
        self.k_bf16, self.v_bf16 = (mk((L, n_bf16_pages, P, H, d), torch.bfloat16) for _ in range(2))
        self.k_clip = [float(c) for c in k_clip]
        self.v_clip = [float(c) for c in v_clip]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k_codes, self.v_codes, self.k_scales,
                                                           self.v_scales, self.k_bf16, self.v_bf16))

    def paged(self, layer: int) -> PagedKV:
        return PagedKV(self.k_codes[layer], self.k_scales[layer], self.v_codes[layer], self.v_scales[layer],
                       self.k_bf16[layer], self.v_bf16[layer], group_size=self.group_size, key_bits=self.key_bits)

    # --- writes (new tokens of one layer) ------------------------------------------------------
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, int2_slots, bf16_slots) -> None:
        """k, v [N, H_kv, d] (rotated); *_slots = (rows long [n], pages int32 [n], offsets int32 [n])."""
        rows, pages, offs = int2_slots
        if rows.numel():
            self._write_int2(layer, k[rows], v[rows], pages, offs)
        rows, pages, offs = bf16_slots
        if rows.numel():
            if self.cpu:
                self.k_bf16[layer][pages.long(), offs.long()] = k[rows].to(torch.bfloat16)
                self.v_bf16[layer][pages.long(), offs.long()] = v[rows].to(torch.bfloat16)
            else:
                from oscar_ray.kernels import bf16_write_kv

                bf16_write_kv(k[rows].contiguous(), v[rows].contiguous(), None, None, pages, offs,
                              self.k_bf16[layer], self.v_bf16[layer])

    def _sides(self, layer: int):
        """(codes, scales, clip, bits) of K then V for `layer`."""
        return ((self.k_codes, self.k_scales, self.k_clip[layer], self.key_bits),
                (self.v_codes, self.v_scales, self.v_clip[layer], 2))

    def _write_int2(self, layer, k, v, pages, offs) -> None:
        if not self.cpu:
            from oscar_ray.kernels import int2_write_kv

            int2_write_kv(k.contiguous(), v.contiguous(), None, None, self.k_clip[layer], self.v_clip[layer], pages,
                          offs, self.k_codes[layer], self.k_scales[layer], self.v_codes[layer], self.v_scales[layer],
                          self.group_size, key_bits=self.key_bits)
            return
        for x, (codes, scales, clip, bits) in zip((k, v), self._sides(layer)):
            c, s = int2_write_reference(x, None, clip, self.group_size, self.scale_dtype, bits)
            codes[layer][pages.long(), offs.long()] = c
            scales[layer][pages.long(), offs.long()] = s

    # --- data moves (all layers) ---------------------------------------------------------------
    def demote(self, demotions: list[Demotion]) -> None:
        """Quantise BF16 pages into INT2 pages for every layer (whole pages: unwritten offsets hold
        zeros and are overwritten when their token comes)."""
        if not demotions:
            return
        src = torch.tensor([m.src for m in demotions], dtype=torch.int32, device=self.device)
        dst = torch.tensor([m.dst for m in demotions], dtype=torch.int32, device=self.device)
        g = self.geometry
        for layer in range(g.n_layers):
            if not self.cpu:  # K and V of every demoted page in one launch per layer
                from oscar_ray.kernels import demote_pages_kv

                demote_pages_kv(self.k_bf16[layer], self.v_bf16[layer], src, dst, self.k_codes[layer],
                                self.k_scales[layer], self.v_codes[layer], self.v_scales[layer], self.k_clip[layer],
                                self.v_clip[layer], self.group_size, key_bits=self.key_bits)
                continue
            for bf16, (codes, scales, clip, bits) in zip((self.k_bf16, self.v_bf16), self._sides(layer)):
                rows = bf16[layer][src.long()].reshape(-1, g.n_kv_heads, g.head_dim)
                c, s = int2_write_reference(rows, None, clip, self.group_size, self.scale_dtype, bits)
                codes[layer][dst.long()] = c.reshape(len(demotions), g.page_size, g.n_kv_heads, -1)
                scales[layer][dst.long()] = s.reshape(len(demotions), g.page_size, g.n_kv_heads, -1)

    def copy(self, copies: list[PageCopy]) -> None:
        """Copy token ranges between pages of one kind (issued by `fork` for a partial tail page)."""
        for c in copies:
            offs = torch.arange(len(c.positions), device=self.device) + c.positions.start % self.geometry.page_size
            tensors = ((self.k_bf16, self.v_bf16) if c.kind is PageKind.BF16
                       else (self.k_codes, self.v_codes, self.k_scales, self.v_scales))
            for t in tensors:
                t[:, c.dst, offs] = t[:, c.src, offs]

    # --- reads (CPU reference path) ------------------------------------------------------------
    def gather(self, layer: int, int2_idx: torch.Tensor, bf16_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat token indices (page · page_size + offset) of both tiers, any leading shape →
        (K, V) float32 [..., T2 + T16, H_kv, d]: dequantised INT2 tokens, then BF16 tokens."""
        g = self.geometry
        out = []
        for codes, scales, bf16, bits in ((self.k_codes, self.k_scales, self.k_bf16, self.key_bits),
                                          (self.v_codes, self.v_scales, self.v_bf16, 2)):
            parts = []
            if int2_idx.shape[-1]:  # (page, offset) indexing: a head-major store has no flat token view
                page, off = int2_idx // g.page_size, int2_idx % g.page_size
                c, s = codes[layer][page, off], scales[layer][page, off]
                parts.append(dequantize_int2(unpack_codes(c, bits), s, self.group_size))
            parts.append(bf16[layer].view(-1, g.n_kv_heads, g.head_dim)[bf16_idx].to(torch.float32))
            out.append(torch.cat(parts, dim=-3) if len(parts) > 1 else parts[0])
        return out[0], out[1]
