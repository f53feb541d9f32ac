"""Which route an extend batch takes, and the glue that runs a batch split over both.

Routes (int2_extend_attention's `method`):
  fused    the one-kernel extend (extend_attention.py): one launch for the whole batch
  dequant  every request by gather + SDPA (extend_dequant.py)
  mixed    requests whose chunk has >= DEQUANT_MIN_CHUNK rows by gather + SDPA, the rest (decode
           rows, short chunks) fused, each part as a sub-batch; the CUDA default ("auto")

Why split: a decode row would gather its whole context for one query and cost an SDPA call of host
time, where the fused kernel serves any number of such rows in one launch; a long chunk is 1.6-1.9×
faster by gather + SDPA on the H200 (one 2048-row chunk at 8K-128K, decode_h200.md).  Batches of
several long chunks and mixed batches were not timed: the caps below are guesses, not measurements.
"""

from __future__ import annotations

import torch

from .extend_dequant import extend_by_sdpa
from .layout import Segments

# Gathered K/V cap (2 GiB: a 128K-token prefix at 8 KV heads × d 128 in bf16 is 512 MiB); above it,
# or with more long requests than DEQUANT_MAX_REQUESTS (an SDPA call each), "auto" stays fused.
DEQUANT_MAX_BYTES = 2 << 30
DEQUANT_MIN_CHUNK = 64
DEQUANT_MAX_REQUESTS = 16


def split_requests(lengths: list[tuple[int, int, int]], row_bytes: int, method: str) -> tuple[list[int], list[int]]:
    """(requests for gather + SDPA, requests for the fused kernel) of a batch of (INT2, BF16, chunk)
    lengths; requests with an empty chunk are in neither.  method "auto" falls back to all-fused when
    the long part exceeds DEQUANT_MAX_REQUESTS or DEQUANT_MAX_BYTES (row_bytes per token row, K and V
    each)."""
    live = [b for b, (_, _, c) in enumerate(lengths) if c]
    if method == "dequant":
        return live, []
    long = [b for b in live if lengths[b][2] >= DEQUANT_MIN_CHUNK]
    short = [b for b in live if lengths[b][2] < DEQUANT_MIN_CHUNK]
    if method == "auto":
        nbytes = 2 * row_bytes * sum(sum(lengths[b]) for b in long)
        if len(long) > DEQUANT_MAX_REQUESTS or nbytes > DEQUANT_MAX_BYTES:
            return [], live
    return long, short


def host_lengths_of(prefix: Segments, qo_indptr: torch.Tensor, nb: int, host_lengths) -> list[tuple[int, int, int]]:
    """(INT2, BF16, chunk) per request from host_lengths or, without them, read back (one sync)."""
    if host_lengths is None:
        host = torch.cat([prefix.int2_lens, prefix.bf16_lens, qo_indptr]).tolist()
        bounds = host[2 * nb:]
        return [(host[b], host[nb + b], bounds[b + 1] - bounds[b]) for b in range(nb)]
    if len(host_lengths) != nb:
        raise ValueError(f"host_lengths has {len(host_lengths)} entries for a batch of {nb} requests")
    return [tuple(int(x) for x in t) for t in host_lengths]


def _bounds(lengths) -> list[int]:
    bounds = [0]
    for _, _, c in lengths:
        bounds.append(bounds[-1] + c)
    return bounds


def sub_batch(reqs: list[int], lengths, prefix: Segments, q, k_new, v_new):
    """Requests `reqs` of a batch as a batch of their own: (rows of theirs in the full batch [R] on
    the device, q/k_new/v_new rows, Segments, qo_indptr, lengths)."""
    dev, bounds = q.device, _bounds(lengths)
    rows = [r for b in reqs for r in range(bounds[b], bounds[b + 1])]
    to_dev = lambda xs, dt: torch.tensor(xs, dtype=dt).to(dev, non_blocking=True)  # noqa: E731
    rows_t, idx = to_dev(rows, torch.int64), to_dev(reqs, torch.int64)
    sub_lengths = [lengths[b] for b in reqs]
    seg = Segments(prefix.int2_page_table.index_select(0, idx), prefix.int2_lens.index_select(0, idx),
                   prefix.bf16_page_table.index_select(0, idx), prefix.bf16_lens.index_select(0, idx))
    qo = to_dev(_bounds(sub_lengths), torch.int32)
    return rows_t, q.index_select(0, rows_t), k_new.index_select(0, rows_t), v_new.index_select(0, rows_t), seg, qo, \
        sub_lengths


def run_routes(method, q, k_new, v_new, kv, prefix, qo_indptr, lengths, dtype, scale, out, fused) -> None:
    """Fill out [ΣC, Hq, d] by the routes split_requests picks; fused(q, k, v, prefix, qo_indptr,
    max_chunk, out) runs the one-kernel extend on a (sub-)batch."""
    long, short = split_requests(lengths, kv.geometry().n_kv_heads * q.shape[2] * dtype.itemsize, method)
    live = len(long) + len(short)
    for reqs, dequant in ((long, True), (short, False)):
        if not reqs:
            continue
        # the whole batch takes this route: no sub-batch copies (the gather would also copy the
        # prefixes of requests with an empty chunk, so dequant takes the shortcut only without them)
        if len(reqs) == live and (not dequant or live == len(lengths)):
            rows, qx, kx, vx, seg, qo, lens, dst = None, q, k_new, v_new, prefix, qo_indptr, lengths, out
        else:
            rows, qx, kx, vx, seg, qo, lens = sub_batch(reqs, lengths, prefix, q, k_new, v_new)
            dst = torch.zeros(rows.shape[0], *out.shape[1:], dtype=out.dtype, device=out.device)
        if dequant:
            extend_by_sdpa(qx, kx, vx, kv, seg, qo, lens, dtype, scale, dst)
        else:
            fused(qx, kx, vx, seg, qo, max(c for _, _, c in lens), dst)
        if rows is not None:
            out.index_copy_(0, rows, dst)
