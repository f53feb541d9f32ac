"""OscarAttnBackend: sglang attention backend over the OSCAR pool, calling oscar_ray.kernels.

Extends `sglang.srt.layers.attention.base_attn_backend.AttentionBackend` (sglang 0.5.23): its
`forward` dispatches to `forward_decode` / `forward_extend(q, k, v, layer, forward_batch,
save_kv_cache)`, which `layers/radix_attention.py::RadixAttention.forward` reaches with
post-RoPE q [T, h_q·d], k / v [T, h_kv, d].  Registered as "oscar" in
`layers/attention/attention_registry.py::ATTENTION_BACKENDS` by the plugin.

Per forward, `init_forward_metadata` plans the writes of the batch's new tokens and updates the
pool's ownership tags once (tables.plan_writes), then builds the kernels' page tables
(tables.build_segments): decode over each request's whole cache, extend over its cached prefix.
Per layer: in extend, write (pool.oscar_write: INT2 into every token's slot, BF16 into the windows),
then int2_extend_attention (the chunk itself at full precision, causally); in decode,
int2_decode_attention (q·R_K inside).  The step's token is written in one of four forms
(backend.decode_write): "side", on a second stream beside the attention
(kernels/side_stream.py, joined at the next forward's start) the BF16 copy (bf16_write_kv) and, for
the requests whose token completes a page, that page's INT2 codes from its arena copy
(demote_pages_kv: one launch per page of 64 tokens instead of an INT2 write per token; tables.py
says why only whole pages need codes), the attention taking the token from its rows and leaving its
window slot unread (attend_new, kernels/_merge.py);
"launch", both copies stored by the attention launch itself (append_k / append_v, rotate_append,
append_int2: kernels/_append.py); "separate", pool.oscar_write before the attention; "rotate", the
BF16 copy stored by the attention's q-rotation launch (store_new, kernels/rotate.py: no launch of its
own) and the completed pages' INT2 codes on the second stream after the attention, as "side" writes
them (without host lengths it writes as "side" does); "rotate" is the default.
"side", "launch" and "rotate" need the step's token to be its request's last BF16-tier token, which holds
when the recent window has a page (the tail page is then always in it); with recent_tokens 0 a
full tail page is INT2 history and both fall back to "separate".  V is in the R_V basis throughout when absorbed (the default), so no
o·R_Vᵀ is computed.  CUDA graphs are not supported yet (init_cuda_graph_state raises).
Loaded only by the plugin: imports sglang.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from oscar_ray.kernels import Segments, int2_decode_attention, int2_extend_attention
from oscar_ray.kernels.extend_routes import DEQUANT_MIN_CHUNK, host_lengths_of
from oscar_ray.kernels.reference import rotate_heads
from oscar_ray.kernels.side_stream import SideStream
from oscar_ray.quant.centre import add_value_mean, centred

from .pool import OscarMHATokenToKVPool
from .tables import PageFills, WritePlan, build_segments, plan_fills, plan_writes


@dataclass(frozen=True)
class OscarForwardMetadata:
    """Per-forward state shared by all layers."""

    plan: WritePlan
    segments: Segments  # decode: the whole cache incl. the new token; extend: the cached prefix
    qo_indptr: torch.Tensor | None  # extend: int32 [B + 1] chunk row offsets
    max_chunk: int
    # extend: (INT2, BF16, chunk) tokens per request on the host, read once per forward so the
    # extend launcher's gather path does not sync in every layer
    host_lengths: list[tuple[int, int, int]] | None = None
    # decode: the longest request on the host, the split rule's length hint (an upper bound of
    # its INT2 tokens; without it the CUDA tier always runs two waves, decode_cuda.default_cuda_splits)
    max_len: int | None = None
    # decode: the slot pages this step's tokens complete (None without host lengths: the "side"
    # form then writes INT2 per token, as "separate" does)
    fills: PageFills | None = None


def _host_max(values, fallback: torch.Tensor) -> int:
    if values is not None and len(values):
        return int(max(values))
    return int(fallback.max().item()) if fallback.numel() else 0


# The decode write's forms, µs added to the same decode launch without a write (H100, 16K context,
# batch 1 / 8 / 32, benchmarks/append_cost.py, 2026-12-07): launch +7.2 / +18.7 / +39.2 (its in-launch
# rotation alone +8.8 / +8.8 / +28.3: the owning split rotates in series with its attention); separate
# +10.1 / +8.9 / +9.0; side with bf16_write_kv still before the attention +3.3 / +3.5 / +0.0, of which
# that launch was ~2.5 µs at bs 1, so "side" moved it beside the attention too; both copies per token
# beside it: +4.0 / +3.7 / +5.9 (adb14cb), +3.5 / +3.2 / +5.3 as one fused launch (20db1a4).  Since
# b0b37c7 "side" writes INT2 codes per completed page: +1.5 / +2.8 / +3.5 amortised (9.0 / 5.6 / 2.4%).
# "rotate" (the BF16 copy by the q rotation's launch, 9e5635e; H100, same run as "side" +1.5 / +2.5 /
# +2.4 on a step completing no page): +0.5 / -0.2 / +0.0, amortised +0.6 / +1.2 / +5.0 = 3.5 / 2.4 /
# 3.5% (side: 8.8 / 5.7 / 3.0%).  That amortisation is pessimistic for "rotate": the harness joins
# its page fill right after the attention (+9.2 / +11.6 / +12.6 on a filling step), where the backend
# joins it at the next forward, behind the rest of the layer.  "rotate" is the default (without CUDA
# or without R_K / host lengths it writes as "side": in series, before the attention, without CUDA).
DECODE_WRITE_FORMS = ("side", "launch", "separate", "rotate")
DEFAULT_DECODE_WRITE = "rotate"


class OscarAttnBackend(AttentionBackend):
    """`--attention-backend oscar`: INT2 history + BF16 sink/recent attention."""

    # int2_extend_attention's method: "auto" gathers + SDPA on CUDA, the fused kernel elsewhere
    extend_method = "auto"
    # the decode step's write: "auto" (DEFAULT_DECODE_WRITE) or one of DECODE_WRITE_FORMS
    decode_write = "auto"

    def __init__(self, model_runner):
        super().__init__()
        pool = model_runner.token_to_kv_pool
        if not isinstance(pool, OscarMHATokenToKVPool):
            raise ValueError(f"--attention-backend oscar needs the OSCAR KV pool, got {type(pool).__name__}: "
                             "is the oscar-ray plugin loaded in this process (SGLANG_PLUGINS)?")
        self.pool = pool
        # the names sglang's forward_context.get_token_to_kv_pool / get_req_to_token_pool read
        self.token_to_kv_pool = pool
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.forward_metadata: OscarForwardMetadata | None = None
        self.side = SideStream(self.device)  # the "side" decode write's copies

    # --- metadata ----------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        fb, pool = forward_batch, self.pool
        # INT2 copies written beside the last forward's attention land before this one reads
        # any slot or updates the tags (plan_writes) the writes were planned with
        self.side.join()
        mode = fb.forward_mode
        if mode.is_idle():
            self.forward_metadata = None
            return
        if mode.is_target_verify() or mode.is_draft_extend_v2() or mode.is_dllm_extend() or mode.is_split_prefill():
            raise NotImplementedError(f"forward mode {mode} (speculative / diffusion / split prefill) is not "
                                      "supported with the OSCAR backend")
        max_len = _host_max(getattr(fb, "seq_lens_cpu", None), fb.seq_lens)
        max_pages = -(-max_len // pool.page_size)
        if mode.is_decode():
            form = self._decode_form()  # a bad decode_write is refused before the tags change
            # one new token per request at position seq_len - 1, already counted in seq_lens
            plan = plan_writes(pool.arena, fb.out_cache_loc, fb.seq_lens - 1, fb.req_pool_indices, fb.seq_lens,
                               pool.slot_owner, pool.ring_tag)
            seg = build_segments(pool.arena, self.req_to_token, fb.req_pool_indices, fb.seq_lens,
                                 pool.slot_owner, pool.ring_tag, max_pages)
            fills = (plan_fills(plan, fb.seq_lens, getattr(fb, "seq_lens_cpu", None), pool.page_size)
                     if form in ("side", "rotate") else None)  # the forms writing INT2 per completed page
            self.forward_metadata = OscarForwardMetadata(plan, seg, None, 1, max_len=max_len, fills=fills)
            return
        if not mode.is_extend():
            raise NotImplementedError(f"forward mode {mode} is not supported with the OSCAR backend")
        ext = fb.extend_seq_lens.to(torch.int64)
        req_tok = torch.repeat_interleave(fb.req_pool_indices.to(torch.int64), ext)
        final = torch.repeat_interleave(fb.seq_lens.to(torch.int64), ext)
        # tags are updated before any layer reads, so a ring page this chunk overwrites is no
        # longer claimed by the prefix page it mirrored (which is then read from INT2)
        plan = plan_writes(pool.arena, fb.out_cache_loc, fb.positions, req_tok, final, pool.slot_owner,
                           pool.ring_tag)
        seg = build_segments(pool.arena, self.req_to_token, fb.req_pool_indices, fb.extend_prefix_lens,
                             pool.slot_owner, pool.ring_tag, max_pages)
        qo = torch.zeros(ext.shape[0] + 1, dtype=torch.int32, device=ext.device)
        qo[1:] = torch.cumsum(ext, 0)
        max_chunk = _host_max(fb.extend_seq_lens_cpu, ext)
        # the launcher's "auto" fuses batches without a chunk of DEQUANT_MIN_CHUNK rows and needs no
        # lengths then: skip the read-back (a sync) for them
        lengths = (None if self.extend_method == "auto" and max_chunk < DEQUANT_MIN_CHUNK
                   else host_lengths_of(seg, qo, ext.shape[0], None))
        self.forward_metadata = OscarForwardMetadata(plan, seg, qo, max_chunk, lengths)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError("the OSCAR backend has no CUDA-graph path yet: launch with --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled")

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    # --- forward -----------------------------------------------------------------------------
    @staticmethod
    def _check_layer(layer) -> None:
        if getattr(layer, "is_cross_attention", False):
            raise NotImplementedError("cross attention is not supported with the OSCAR backend")
        if getattr(layer, "sliding_window_size", -1) not in (-1, None) or (getattr(layer, "logit_cap", 0) or 0) > 0:
            raise NotImplementedError(f"layer {layer.layer_id}: sliding windows / logit capping are not supported")
        if layer.qk_head_dim != layer.v_head_dim:
            raise NotImplementedError("OSCAR needs qk_head_dim == v_head_dim")

    @staticmethod
    def _check_save(k, save_kv_cache: bool) -> None:
        if not save_kv_cache or k is None:
            raise NotImplementedError("the OSCAR backend writes the cache itself; save_kv_cache=False means "
                                      "another writer ran (fused rope+KV kernels must be off)")

    def _write(self, layer, k, v, save_kv_cache: bool):
        self._check_save(k, save_kv_cache)
        h, d = layer.tp_k_head_num, layer.qk_head_dim
        self.pool.oscar_write(layer.layer_id, k.reshape(-1, h, d), v.reshape(-1, h, d), self.forward_metadata.plan)

    def _rotations(self, layer):
        r_k, r_v, _, _ = self.pool.rotations.layer(layer.layer_id)
        return r_k, (None if self.pool.oscar.settings.absorb_v else r_v)

    def _centre(self, layer, k, v):
        """k, v − the calibrated channel means (exact, quant/centre.py); returns (k, v, μ_V or None)."""
        means = self.pool.rotations.means(layer.layer_id, self.pool.oscar.settings.absorb_v)
        if means is None or k is None:
            return k, v, None
        mu_k, mu_v = means
        h, d = layer.tp_k_head_num, layer.qk_head_dim
        k = centred(k.reshape(-1, h, d).float(), mu_k).to(k.dtype)
        return k, centred(v.reshape(-1, h, d).float(), mu_v).to(v.dtype), mu_v

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer)
        self._check_save(k, save_kv_cache)
        k, v, mu_v = self._centre(layer, k, v)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        r_k, r_v = self._rotations(layer)
        plan = self.forward_metadata.plan
        attend = dict(k_rotation=r_k, v_rotation=r_v, sm_scale=layer.scaling,
                      max_int2_len=self.forward_metadata.max_len)
        k3, v3 = k.reshape(-1, hkv, d), v.reshape(-1, hkv, d)
        form = self._decode_form()
        if form == "launch":  # both copies inside the attention launch, by its writer programs
            _, _, k_clip, v_clip = self.pool.rotations.layer(layer.layer_id)
            attend.update(append_k=k3, append_v=v3, rotate_append=True,
                          append_int2=(plan.int2_page, plan.int2_off), append_clip=(k_clip, v_clip))
        elif form == "separate":  # int2_write_kv + bf16_write_kv, then the attention reads the BF16 slot
            self.pool.oscar_write(layer.layer_id, k3, v3, plan)
        elif form == "rotate" and self.forward_metadata.fills is not None and r_k is not None:
            # the BF16 copy by the q rotation's launch, read back from its slot by the attention
            attend["store_new"] = (k3, v3, plan.bf16_page, plan.bf16_off)
        else:  # side: the copies beside the attention, which takes the token from k3 / v3
            self.side.run(lambda: self._side_write(layer.layer_id, k3, v3), k3, v3)
            # attend_new's v is in the cache's V basis: v3 already is when absorbed (r_v None)
            attend["attend_new"] = (k3, v3 if r_v is None else rotate_heads(v3, r_v))
        o = int2_decode_attention(q.reshape(-1, hq, d), self.pool.paged_kv(layer.layer_id),
                                  self.forward_metadata.segments, **attend)
        fills = self.forward_metadata.fills
        if "store_new" in attend and fills.count:  # after the launch that wrote the pages' last rows
            self.side.run(lambda: self.pool.oscar_fill(layer.layer_id, fills))
        return add_value_mean(o, mu_v).to(q.dtype).reshape(-1, hq * d)

    def _decode_form(self) -> str:
        """The decode write form this backend uses now (decode_write resolved; see the module docstring)."""
        form = DEFAULT_DECODE_WRITE if self.decode_write == "auto" else self.decode_write
        if form not in DECODE_WRITE_FORMS:
            raise ValueError(f"decode_write must be 'auto' or one of {DECODE_WRITE_FORMS}, got {form!r}")
        if self.pool.geometry.recent_pages == 0:
            return "separate"  # the new token may be INT2 history (module docstring)
        return form

    def _side_write(self, layer_id: int, k3, v3) -> None:
        """The "side" form's launches: the BF16 copy every step and the INT2 codes of the pages
        the step completes (one bf16_write_kv, plus a demote_pages_kv on ~1 step in 64 at bs 1 and
        page 64), or both copies per token when the host lengths are unknown."""
        meta = self.forward_metadata
        if meta.fills is None:
            self.pool.oscar_write(layer_id, k3, v3, meta.plan)
            return
        self.pool.oscar_write_bf16(layer_id, k3, v3, meta.plan)
        self.pool.oscar_fill(layer_id, meta.fills)  # after the BF16 write: the page's last row

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer)
        k, v, mu_v = self._centre(layer, k, v)
        self._write(layer, k, v, save_kv_cache)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        r_k, r_v = self._rotations(layer)
        meta = self.forward_metadata
        o = int2_extend_attention(q.reshape(-1, hq, d), k.reshape(-1, hkv, d), v.reshape(-1, hkv, d),
                                  self.pool.paged_kv(layer.layer_id), meta.segments, meta.qo_indptr,
                                  max_chunk=meta.max_chunk, k_rotation=r_k, v_rotation=r_v,
                                  sm_scale=layer.scaling, method=self.extend_method,
                                  host_lengths=meta.host_lengths)
        return add_value_mean(o, mu_v).to(q.dtype).reshape(-1, hq * d)


def create_oscar_backend(runner) -> OscarAttnBackend:
    """Factory registered with sglang's register_attention_backend("oscar")."""
    return OscarAttnBackend(runner)
