"""OscarMHATokenToKVPool: sglang's MHA token-to-KV pool holding the OSCAR INT2 + BF16 tiers.

Extends `sglang.srt.mem_cache.memory_pool.MHATokenToKVPool` (sglang 0.5.23), whose docstring-
level contract for subclasses chosen through `KVCacheConfigurator._resolve_kv_pool_class` is: take
the same constructor arguments, override `_create_buffers` to change the storage.  sglang still
owns the slot ids (allocator, radix cache, `req_to_token`); this pool owns what a slot holds:

  per layer, K and V each (oscar_ray.kernels.layout shapes, page = --page-size P):
    codes   uint8      [(size + P) / P, P, h, d/4]   every slot (slot s = page s//P, offset s%P)
    scales  fp16|fp32  [(size + P) / P, P, h, 2·G]
    bf16    bfloat16   [max_reqs·W + 1, P, h, d]      sink + recent arena (tables.ArenaLayout)
  ring_tag int32 [max_reqs·W + 1], slot_owner int32 [(size + P) / P]: the ownership tags.

Bytes per slot are PageGeometry.int2_token_bytes() (72 B per head-layer at d=128 with fp16 scales
against 512 B in BF16); the arena is a fixed ArenaLayout.arena_bytes().  Only this module's
backend (`--attention-backend oscar`) can read the layout, so the generic slot views
(`get_key_buffer`) are the INT2 codes and the paths that copy raw KV rows (CPU offload, PD
transfer, KV moves for speculative decoding) raise.  Loaded only by the plugin: imports sglang.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass

import torch
from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from oscar_ray.kernels import PagedKV, bf16_write_kv, demote_pages_kv, int2_write_kv
from oscar_ray.kernels.layout import int2_zeros

from .settings import SCALE_BYTES, OscarSettings
from .sharding import RankRotations
from .tables import ArenaLayout, PageFills, WritePlan

logger = logging.getLogger(__name__)
_SCALE_DTYPES = {2: torch.float16, 4: torch.float32}


@dataclass(frozen=True)
class OscarPoolSpec:
    """What sglang's constructor arguments lack: plugin settings, request slots, this rank's rotations."""

    settings: OscarSettings
    max_reqs: int
    rotations: RankRotations


_PENDING: contextvars.ContextVar[OscarPoolSpec | None] = contextvars.ContextVar("oscar_pool_spec", default=None)


@contextlib.contextmanager
def pool_spec(spec: OscarPoolSpec):
    """Scope in which sglang's configurator builds OscarMHATokenToKVPool with `spec` (set by the
    plugin's hook on KVCacheConfigurator._build_token_to_kv_pool)."""
    token = _PENDING.set(spec)
    try:
        yield
    finally:
        _PENDING.reset(token)


class OscarMHATokenToKVPool(MHATokenToKVPool):
    """INT2 + BF16 OSCAR storage behind sglang's slot ids (see the module docstring)."""

    def __init__(self, *args, oscar: OscarPoolSpec | None = None, **kwargs):
        spec = oscar or _PENDING.get()
        if spec is None:
            raise ValueError("OscarMHATokenToKVPool needs an OscarPoolSpec: pass oscar=... or build it inside "
                             "pool_spec(...) (the plugin does, for --attention-backend oscar)")
        self.oscar = spec
        super().__init__(*args, **kwargs)

    # --- storage -----------------------------------------------------------------------------
    def _create_buffers(self):
        if self.is_quantized_kv_cache or self.store_dtype != torch.bfloat16:
            raise ValueError(f"the OSCAR pool stores its own INT2/BF16 tiers: keep --kv-cache-dtype auto with a "
                             f"bfloat16 model, got {self.dtype}")
        if self.post_capture_active or self.kv_cache_layout != "nhd":
            raise ValueError(f"the OSCAR pool supports the NHD layout without post-capture backing, got "
                             f"{self.kv_cache_layout!r}, post_capture={self.post_capture_active}")
        if self.head_dim != self.v_head_dim:
            raise ValueError(f"OSCAR needs head_dim == v_head_dim, got {self.head_dim} and {self.v_head_dim}")
        rows = self.size + self.page_size
        if rows % self.page_size:
            raise ValueError(f"pool size {self.size} is not a whole number of pages of {self.page_size}")
        s = self.oscar.settings
        self.geometry = s.geometry(self.layer_num, self.head_num, self.head_dim, self.page_size)
        self.arena = ArenaLayout(self.geometry, self.oscar.max_reqs)
        g, h, d, p = self.geometry, self.head_num, self.head_dim, self.page_size
        n_pages = rows // p
        sdt = _SCALE_DTYPES[SCALE_BYTES[s.scale_dtype]]
        dev = self.device

        def per_layer(shape, dtype, int2=False):  # INT2 tensors head-major when the geometry says so
            return [int2_zeros(shape, dtype, dev, int2 and g.head_major) for _ in range(self.layer_num)]

        with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
            self.k_codes = per_layer(g.key_code_shape(n_pages), torch.uint8, True)
            self.v_codes = per_layer(g.int2_code_shape(n_pages), torch.uint8, True)
            self.k_scales = per_layer(g.int2_scale_shape(n_pages), sdt, True)
            self.v_scales = per_layer(g.int2_scale_shape(n_pages), sdt, True)
            self.k_bf16 = per_layer(g.bf16_shape(self.arena.n_pages), torch.bfloat16)
            self.v_bf16 = per_layer(g.bf16_shape(self.arena.n_pages), torch.bfloat16)
        self.ring_tag = torch.full((self.arena.n_pages,), -1, dtype=torch.int32, device=dev)
        self.slot_owner = torch.full((n_pages,), -1, dtype=torch.int32, device=dev)
        # slot-row views for sglang's generic bookkeeping (data pointers, size logs); never KV values
        # (head-major: the same bytes, viewed through the storage order; rows are then not tokens)
        storage = (lambda c: c.transpose(1, 2)) if g.head_major else (lambda c: c)
        self.k_buffer = [storage(c).view(rows, h, c.shape[-1]) for c in self.k_codes]
        self.v_buffer = [storage(c).view(rows, h, d // 4) for c in self.v_codes]
        self.k_scale_buffer = self.v_scale_buffer = None
        self.native_k_scale_buffer = self.native_v_scale_buffer = None
        self.dq_k_buffer = self.dq_v_buffer = None
        self._kv_buffer_descs = []
        self._init_data_ptrs_and_strides()
        for layer in range(self.layer_num):  # shapes, dtypes and strides as the kernels check them
            self._paged(layer).geometry()
        self.rotations = self.oscar.rotations.to(dev)
        logger.info("OSCAR pool: %d slots x %d B INT2 + %d arena pages (%.2f GiB BF16), %d layers x %d KV heads",
                    rows, g.int2_token_bytes(), self.arena.n_pages, self.arena.arena_bytes() / 2**30,
                    self.layer_num, h)

    def _paged(self, local_layer: int) -> PagedKV:
        return PagedKV(self.k_codes[local_layer], self.k_scales[local_layer], self.v_codes[local_layer],
                       self.v_scales[local_layer], self.k_bf16[local_layer], self.v_bf16[local_layer],
                       group_size=self.geometry.group_size, key_bits=self.geometry.key_bits)

    def paged_kv(self, layer_id: int) -> PagedKV:
        """Both tiers of global layer `layer_id`, as oscar_ray.kernels read them."""
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        return self._paged(layer_id - self.start_layer)

    def get_kv_size_bytes(self):
        """(K bytes, V bytes) actually allocated: INT2 codes + scales of every slot, plus the arena."""
        def total(tensors):
            return sum(t.numel() * t.element_size() for t in tensors)
        return (total(self.k_codes) + total(self.k_scales) + total(self.k_bf16),
                total(self.v_codes) + total(self.v_scales) + total(self.v_bf16))

    # --- writes ------------------------------------------------------------------------------
    def oscar_write(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, plan: WritePlan) -> None:
        """Store new K/V rows [N, h, d] (post-RoPE K; V in the R_V basis when absorbed) of one layer:
        INT2 codes into every token's slot, rotated BF16 copies into the windows' arena pages (others
        to the scratch page), both by one int2_write_kv launch (two at a decode step's few rows,
        write.py's two-pass form) instead of int2_write_kv + bf16_write_kv."""
        local, r_k, r_v_write, k_clip, v_clip = self._write_args(layer_id)  # absorbed: v already is v·R_V
        int2_write_kv(k, v, r_k, r_v_write, k_clip, v_clip, plan.int2_page, plan.int2_off,
                      self.k_codes[local], self.k_scales[local], self.v_codes[local], self.v_scales[local],
                      self.geometry.group_size, key_bits=self.geometry.key_bits,
                      bf16_copy=(plan.bf16_page, plan.bf16_off, self.k_bf16[local], self.v_bf16[local]))

    def oscar_write_bf16(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, plan: WritePlan) -> None:
        """The rotated BF16 copies of new rows only (bf16_write_kv, one launch): a decode step whose
        INT2 copies are written per page when the page fills (oscar_fill), not per token."""
        local, r_k, r_v_write, _, _ = self._write_args(layer_id)
        bf16_write_kv(k, v, r_k, r_v_write, plan.bf16_page, plan.bf16_off, self.k_bf16[local], self.v_bf16[local])

    def oscar_fill(self, layer_id: int, fills: PageFills) -> None:
        """INT2 codes of whole slot pages from the arena pages mirroring them (demote_pages_kv, one
        launch; none when no page filled).  The arena rows are already rotated, so this clips,
        quantises and packs only; they are the rotated rows rounded to bf16, so a code can differ
        from int2_write_kv's by one level where a value sits within bf16 rounding of a boundary."""
        if fills.count == 0:
            return
        local, _, _, k_clip, v_clip = self._write_args(layer_id)
        demote_pages_kv(self.k_bf16[local], self.v_bf16[local], fills.arena_page, fills.slot_page,
                        self.k_codes[local], self.k_scales[local], self.v_codes[local], self.v_scales[local],
                        k_clip, v_clip, self.geometry.group_size, key_bits=self.geometry.key_bits)

    def _write_args(self, layer_id: int):
        r_k, r_v, k_clip, v_clip = self.rotations.layer(layer_id)
        return layer_id - self.start_layer, r_k, (None if self.oscar.settings.absorb_v else r_v), k_clip, v_clip

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, *args, **kwargs):
        # Writing needs token positions and request slots, which this signature lacks; the OSCAR
        # backend writes through oscar_write. Reaching here means another writer (a fused
        # rope+KV kernel, another backend) would corrupt the cache silently.
        raise NotImplementedError("the OSCAR pool is written by the 'oscar' attention backend only "
                                  "(fused set_kv_buffer paths must be off: the plugin patches "
                                  "sglang.srt.models.utils.enable_fused_set_kv_buffer)")

    def _unsupported(self, what: str):
        raise NotImplementedError(f"{what} is not supported with the OSCAR KV pool")

    def get_cpu_copy(self, *args, **kwargs):
        self._unsupported("CPU KV offload (get_cpu_copy)")

    def load_cpu_copy(self, *args, **kwargs):
        self._unsupported("CPU KV offload (load_cpu_copy)")

    def get_contiguous_buf_infos(self):
        self._unsupported("PD-disaggregation KV transfer")

    def move_kv_cache(self, tgt_loc, src_loc):
        self._unsupported("KV slot moves (speculative decoding)")
