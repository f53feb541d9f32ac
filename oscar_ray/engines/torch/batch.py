"""One engine step as the attention function sees it: packed rows, slots to write, prefixes to read.

All requests of a step are packed into one sequence of N rows (batch 1, explicit position ids):
decodes contribute 1 row, prefill chunks C rows. For every layer the attention function
  1. rotates q and k by R_K (OSCAR; values arrive rotated through the absorbed W_v),
  2. writes the step's new k/v into their slots (INT2 or BF16, the allocator decided; on CUDA a
     decode step's BF16 ring write runs inside the decode launch),
  3. attends each request's rows over [its cached prefix ‖ its own new rows, causally]: the prefix
     from the pages (INT2 dequantised), the new rows at full precision, as in the authors'
     prefill (OSCAR_SPEC §5.2); a decode is a chunk of one.
CPU batches all decodes into one padded SDPA call and runs each prefill chunk as its own call;
CUDA runs every request in one `int2_extend_attention` launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from oscar_ray.cache import PageKind, Segments as PageSegments
from oscar_ray.kernels.layout import Segments
from oscar_ray.kernels.reference import rotate_heads
from oscar_ray.quant.centre import add_value_mean, centred

from .kvstore import KVStore

INT2 = PageKind.INT2


@dataclass
class StepItem:
    """Rows start .. start + n_new - 1 of one request; `write` False for rows whose KV is already
    cached (a full prefix-cache hit still recomputes its last token for the logits)."""

    key: object
    segments: PageSegments
    start: int
    n_new: int
    write: bool = True


def _page_arrays(seg: PageSegments, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = list(seg.sink) + list(seg.history) + list(seg.ring)
    kinds = [False] * len(seg.sink) + [True] * len(seg.history) + [False] * len(seg.ring)
    return (torch.tensor(ids, dtype=torch.long, device=device), torch.tensor(kinds, dtype=torch.bool, device=device))


@dataclass
class StepBatch:
    store: KVStore
    items: list[StepItem]
    k_rotation: torch.Tensor | None  # [L, d, d] or [L, H_kv, d, d] fp32 on the device; None = BF16 baseline
    # (μ_K [L, H_kv, d] post-RoPE, μ_V·R_V [L, H_kv, d]) on the device, or None: every key and value
    # the cache holds is centred, which is exact (quant/centre.py) and lets INT2 spend its levels on
    # what differs between tokens
    means: tuple[torch.Tensor, torch.Tensor] | None = None
    positions: torch.Tensor = field(init=False)
    bounds: list[tuple[int, int]] = field(init=False)

    def __post_init__(self) -> None:
        # slots and positions are computed on the host and copied once per tensor: on CUDA, doing
        # this per request on the device cost ~10 small launches and 2 synchronous copies each
        dev, host, P = self.store.device, torch.device("cpu"), self.store.geometry.page_size
        self.bounds, pos, lo = [], [], 0
        w2, w16 = ([], [], []), ([], [], [])
        self._pages = []
        for it in self.items:
            ids, is2 = _page_arrays(it.segments, host)
            self._pages.append((ids, is2))
            new = torch.arange(it.start, it.start + it.n_new)
            pos.append(new)
            if it.write:
                pg, off = new // P, (new % P).to(torch.int32)
                k2 = is2[pg]
                rows = torch.arange(lo, lo + it.n_new)
                for sel, dst in ((k2, w2), (~k2, w16)):
                    dst[0].append(rows[sel]), dst[1].append(ids[pg][sel].to(torch.int32)), dst[2].append(off[sel])
            self.bounds.append((lo, lo + it.n_new))
            lo += it.n_new
        self.n_rows = lo
        self.positions = torch.cat(pos).to(dev)
        cat = lambda xs, dt: (torch.cat(xs).to(dt) if xs else torch.zeros(0, dtype=dt)).to(dev)  # noqa: E731
        self.int2_slots = (cat(w2[0], torch.long), cat(w2[1], torch.int32), cat(w2[2], torch.int32))
        self.bf16_slots = (cat(w16[0], torch.long), cat(w16[1], torch.int32), cat(w16[2], torch.int32))
        if self.store.cpu:
            self._plan_cpu()
        else:
            self._plan_cuda()

    # --- plans -----------------------------------------------------------------------------------
    def _plan_cpu(self) -> None:
        dev, P = self.store.device, self.store.geometry.page_size
        self.prefix2, self.prefix16 = [], []
        for it, (ids, is2) in zip(self.items, self._pages):
            old = torch.arange(it.start, device=dev)
            flat, k2 = ids[old // P] * P + old % P, is2[old // P]
            self.prefix2.append(flat[k2])
            self.prefix16.append(flat[~k2])
        dec = [b for b, it in enumerate(self.items) if it.n_new == 1]
        self.extend_items = [b for b, it in enumerate(self.items) if it.n_new > 1]
        self.decode_rows = torch.tensor([self.bounds[b][0] for b in dec], dtype=torch.long, device=dev)
        self.decode = None
        if dec:
            t2 = max(self.prefix2[b].numel() for b in dec)
            t16 = max(self.prefix16[b].numel() for b in dec)
            i2 = torch.zeros(len(dec), t2, dtype=torch.long, device=dev)
            i16 = torch.zeros(len(dec), t16, dtype=torch.long, device=dev)
            mask = torch.zeros(len(dec), t2 + t16 + 1, dtype=torch.bool, device=dev)
            for r, b in enumerate(dec):
                n2, n16 = self.prefix2[b].numel(), self.prefix16[b].numel()
                i2[r, :n2], i16[r, :n16] = self.prefix2[b], self.prefix16[b]
                mask[r, :n2] = True
                mask[r, t2:t2 + n16] = True
            mask[:, -1] = True  # the new token itself
            self.decode = (i2, i16, mask[:, None, None, :])  # [B, 1, 1, T]

    def _plan_cuda(self) -> None:
        """Page tables of both tiers per request, from the segment lists by slicing (no per-page
        Python loop: 15 requests of 128K tokens hold 30K pages at page 64).
        A step of decodes only reads each request's whole cache including the new token (written
        by the same launch, see fused_append) with the split-K decode kernel: the extend kernel's one program per
        (query head, request) walks the whole context serially, a few programs for 132 SMs at
        batch 1.  Any step with a prefill chunk uses the extend kernel over the cached prefix."""
        dev, P = self.store.device, self.store.geometry.page_size
        self.decode_only = all(it.n_new == 1 for it in self.items)
        t2, t16, l2, l16 = [], [], [], []
        for it in self.items:
            n = it.start + 1 if self.decode_only else it.start  # tokens of the cache the kernel reads
            seg = it.segments
            ns, nh, n_pages = len(seg.sink), len(seg.history), -(-n // P)
            n2 = max(0, min(n, (ns + nh) * P) - min(n, ns * P))  # history pages are full but maybe the last
            t2.append(list(seg.history[:max(0, min(nh, n_pages - ns))]))
            t16.append(list(seg.sink[:min(ns, n_pages)]) + list(seg.ring)[:max(0, n_pages - ns - nh)])
            l2.append(n2), l16.append(n - n2)
        width = lambda rows: max(1, max(map(len, rows)))  # noqa: E731
        pad = lambda rows: torch.tensor([r + [0] * (width(rows) - len(r)) for r in rows],  # noqa: E731
                                        dtype=torch.int32).to(dev, non_blocking=True)
        lens = lambda xs: torch.tensor(xs, dtype=torch.int32).to(dev, non_blocking=True)  # noqa: E731
        self.segments = Segments(pad(t2), lens(l2), pad(t16), lens(l16))
        self.max_int2_len, self.max_bf16_len = max(l2), max(l16)
        starts = [lo for lo, _ in self.bounds] + [self.n_rows]
        self.qo_indptr = torch.tensor(starts, dtype=torch.int32).to(dev, non_blocking=True)
        self.max_chunk = max(it.n_new for it in self.items)
        # the extend launcher's gather path reads these instead of syncing on the device copies
        self.host_lengths = [(a, b, hi - lo) for a, b, (lo, hi) in zip(l2, l16, self.bounds)]
        # decode steps whose new tokens all land in BF16 slots (always, unless a row is a cached
        # token recomputed for its logits): the ring write fuses into the decode launch, which
        # stores row b at request b's last BF16-tier slot, the slot the allocator gave that token
        self.fused_append = (self.decode_only and self.int2_slots[0].numel() == 0
                             and self.bf16_slots[0].numel() == len(self.items))

    # --- the per-layer work ----------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, d], k/v [N, H_kv, d] (post-norm, post-RoPE; v in the R_V basis) → o [N, Hq, d] fp32."""
        r = None if self.k_rotation is None else self.k_rotation[layer]
        if self.means is None:
            return self._attend(layer, *self._rotate(q, k, r), v.to(torch.float32))
        mu_k, mu_v = self.means[0][layer], self.means[1][layer]
        q, k = self._rotate(q, centred(k.float(), mu_k), r)
        out = self._attend(layer, q, k, centred(v.float(), mu_v))
        return add_value_mean(out, mu_v)

    def _rotate(self, q: torch.Tensor, k: torch.Tensor, r: torch.Tensor | None):
        """(q·R_K, k·R_K) fp32: one Triton launch on the GPU (kernels/rotate.py: two torch matmuls and
        casts cost ~6 µs of a 14 µs bs-1 decode step on an H100), torch on the CPU store."""
        if r is None or self.store.cpu:
            return rotate_heads(q, r), rotate_heads(k, r)
        from oscar_ray.kernels import rotate_qk

        return rotate_qk(q, r, k)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not self.store.cpu and self.fused_append:
            # every request's new token goes to the tail of its BF16 tier: the decode launch writes it
            return _decode(q, self.store.paged(layer), self.segments, self.max_int2_len, self.max_bf16_len, (k, v))
        self.store.write(layer, k, v, self.int2_slots, self.bf16_slots)
        if not self.store.cpu:
            if self.decode_only:
                return _decode(q, self.store.paged(layer), self.segments, self.max_int2_len, self.max_bf16_len)
            from oscar_ray.kernels import int2_extend_attention

            return int2_extend_attention(q, k, v, self.store.paged(layer), self.segments, self.qo_indptr,
                                         max_chunk=self.max_chunk, host_lengths=self.host_lengths)
        out = torch.empty_like(q)
        if self.decode is not None:
            i2, i16, mask = self.decode
            pk, pv = self.store.gather(layer, i2, i16)  # [B, T-1, H, d]
            rows = self.decode_rows
            kk = torch.cat([pk, k[rows, None]], dim=1).transpose(1, 2)  # [B, H, T, d]
            vv = torch.cat([pv, v[rows, None]], dim=1).transpose(1, 2)
            o = F.scaled_dot_product_attention(q[rows, None].transpose(1, 2), kk, vv, attn_mask=mask, enable_gqa=True)
            out[rows] = o[:, :, 0]
        for b in self.extend_items:
            lo, hi = self.bounds[b]
            pk, pv = self.store.gather(layer, self.prefix2[b], self.prefix16[b])  # [T, H, d]
            kk = torch.cat([pk, k[lo:hi]]).transpose(0, 1)[None]
            vv = torch.cat([pv, v[lo:hi]]).transpose(0, 1)[None]
            c, t = hi - lo, pk.shape[0]
            mask = torch.ones(c, t + c, dtype=torch.bool).tril_(t)  # row i sees the prefix and new rows ≤ i
            o = F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1)[None], kk, vv, attn_mask=mask,
                                               enable_gqa=True)
            out[lo:hi] = o[0].transpose(0, 1)
        return out


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _decode(q: torch.Tensor, kv, seg: Segments, max_int2: int, max_bf16: int, append=None) -> torch.Tensor:
    """The split-K decode kernel with split counts from the longest request of each tier, rounded
    up to a power of two so that a growing context compiles O(log n) kernel variants, not one per
    512 tokens (the INT2 tier's count and tile from the launcher's defaults for that length).
    The BF16 tier gets as many splits as INT2 would when it is long (kv_cache=bf16: every token
    is BF16; the kernel's default ≤ 8 BF16 splits leave 64 programs at batch 1).
    append (k, v) [B, H_kv, d]: the step's new rows, written by the launch (int2_decode_attention)."""
    from oscar_ray.kernels import default_bf16_splits, default_num_splits, int2_decode_attention

    b, hkv = q.shape[0], kv.k_bf16.shape[2]
    ak, av = append if append is not None else (None, None)
    if q.device.type == "cpu":  # Triton's interpreter runs programs one after another: splits only add work
        return int2_decode_attention(q, kv, seg, num_splits=1, bf16_splits=1, append_k=ak, append_v=av)
    # the INT2 tier's splits from the launcher's own rule for whichever kernel serves it (the CUDA
    # tier kernel and the Triton stage 1 split differently), given the rounded length
    s16 = max(default_bf16_splits(b, hkv), default_num_splits(b, hkv, _pow2_at_least(max(1, max_bf16)), block_n=64))
    return int2_decode_attention(q, kv, seg, max_int2_len=_pow2_at_least(max(1, max_int2)), bf16_splits=s16,
                                 append_k=ak, append_v=av)


ATTN_IMPL = "oscar_paged"


def _paged_attention(module, query, key, value, attention_mask, **kwargs):
    step: StepBatch | None = kwargs.get("oscar_step")
    if step is None:
        raise RuntimeError("the oscar_paged attention needs oscar_step=StepBatch in the forward kwargs")
    # [1, H, N, d] → [N, H, d]
    o = step.attend(module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1))
    return o[None].to(query.dtype), None  # [1, N, Hq, d], as transformers' attention functions return


def register_attention() -> str:
    """Register the paged attention in transformers' AttentionInterface; returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPL, _paged_attention)
    return ATTN_IMPL
