"""One engine step as the attention function sees it: packed rows, slots to write, prefixes to read.

All requests of a step are packed into one sequence of N rows (batch 1, explicit position ids):
decodes contribute 1 row, prefill chunks C rows. For every layer the attention function
  1. rotates q and k by R_K (OSCAR; values arrive rotated through the absorbed W_v),
  2. writes the step's new k/v into their slots (INT2 or BF16, the allocator decided),
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
    positions: torch.Tensor = field(init=False)
    bounds: list[tuple[int, int]] = field(init=False)

    def __post_init__(self) -> None:
        dev, P = self.store.device, self.store.geometry.page_size
        self.bounds, pos, lo = [], [], 0
        w2, w16, prefix2, prefix16 = ([], [], []), ([], [], []), [], []
        for it in self.items:
            ids, is2 = _page_arrays(it.segments, dev)
            new = torch.arange(it.start, it.start + it.n_new, device=dev)
            pos.append(new)
            if it.write:
                pg, off = new // P, (new % P).to(torch.int32)
                k2 = is2[pg]
                rows = torch.arange(lo, lo + it.n_new, device=dev)
                for sel, dst in ((k2, w2), (~k2, w16)):
                    dst[0].append(rows[sel]), dst[1].append(ids[pg][sel].to(torch.int32)), dst[2].append(off[sel])
            old = torch.arange(it.start, device=dev)
            flat, k2 = ids[old // P] * P + old % P, is2[old // P]
            prefix2.append(flat[k2])
            prefix16.append(flat[~k2])
            self.bounds.append((lo, lo + it.n_new))
            lo += it.n_new
        self.n_rows = lo
        self.positions = torch.cat(pos)
        cat = lambda xs, dt: torch.cat(xs).to(dt) if xs else torch.zeros(0, dtype=dt, device=dev)  # noqa: E731
        self.int2_slots = (cat(w2[0], torch.long), cat(w2[1], torch.int32), cat(w2[2], torch.int32))
        self.bf16_slots = (cat(w16[0], torch.long), cat(w16[1], torch.int32), cat(w16[2], torch.int32))
        self.prefix2, self.prefix16 = prefix2, prefix16
        if self.store.cpu:
            self._plan_cpu()
        else:
            self._plan_cuda()

    # --- plans -----------------------------------------------------------------------------------
    def _plan_cpu(self) -> None:
        dev = self.store.device
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
        dev, P = self.store.device, self.store.geometry.page_size
        t2, t16, l2, l16 = [], [], [], []
        for it in self.items:
            ids = list(it.segments.sink) + list(it.segments.history) + list(it.segments.ring)
            kinds = [False] * len(it.segments.sink) + [True] * len(it.segments.history) + [False] * len(it.segments.ring)
            n_pages = -(-it.start // P)
            rows2, rows16, n2, n16 = [], [], 0, 0
            for j in range(n_pages):
                tokens = min(P, it.start - j * P)
                if kinds[j]:
                    rows2.append(ids[j]), None
                    n2 += tokens
                else:
                    rows16.append(ids[j])
                    n16 += tokens
            t2.append(rows2), t16.append(rows16), l2.append(n2), l16.append(n16)
        pad = lambda rows: torch.tensor([r + [0] * (max(1, max(map(len, rows))) - len(r)) for r in rows],  # noqa: E731
                                        dtype=torch.int32, device=dev)
        self.segments = Segments(pad(t2), torch.tensor(l2, dtype=torch.int32, device=dev),
                                 pad(t16), torch.tensor(l16, dtype=torch.int32, device=dev))
        starts = [lo for lo, _ in self.bounds] + [self.n_rows]
        self.qo_indptr = torch.tensor(starts, dtype=torch.int32, device=dev)
        self.max_chunk = max(it.n_new for it in self.items)

    # --- the per-layer work ----------------------------------------------------------------------
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, d], k/v [N, H_kv, d] (post-norm, post-RoPE; v in the R_V basis) → o [N, Hq, d] fp32."""
        r = None if self.k_rotation is None else self.k_rotation[layer]
        q, k, v = rotate_heads(q, r), rotate_heads(k, r), v.to(torch.float32)
        self.store.write(layer, k, v, self.int2_slots, self.bf16_slots)
        if not self.store.cpu:
            from oscar_ray.kernels import int2_extend_attention

            return int2_extend_attention(q, k, v, self.store.paged(layer), self.segments, self.qo_indptr,
                                         max_chunk=self.max_chunk)
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
