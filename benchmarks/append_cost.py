"""What the decode launch's own write of the step's new token costs, piece by piece (Qwen3-8B geometry).

    python benchmarks/append_cost.py --out /tmp/append.md
    TRITON_INTERPRET=1 python benchmarks/append_cost.py --smoke --out /tmp/append.md   # CPU check

One decode launch over a 16K mixed cache per batch size, timed as decode_attention.py times it (CUDA
graphs over input copies that miss L2, medians), in these forms:
  rot          q rotated by R_K, no append (the baseline of the sglang forms)
  ring         the torch engine's fused ring write: already rotated rows stored BF16
  rot+bf16     rows rotated by R_K in the launch, stored BF16 (no INT2 copy)
  sglang       + the INT2 copy by the two writer programs, K clipped at 0.96: the "launch" form
  separate     int2_write_kv with its bf16_copy (the pool's oscar_write: both copies, two launches at
               these row counts), then the rot launch (until 954b9eb: int2_write_kv + bf16_write_kv)
  bf16 side    bf16_write_kv, then the rot launch, with int2_write_kv on a second stream beside them
               (kernels/side_stream.py), joined at the call's end (the backend's "side" form until
               c083460; named "side sep" in the raw file of 2026-12-07, whose "side" was rot+bf16
               with int2_write_kv on the second stream)
  side         oscar_write's launches on the second stream, the rot launch attending the new token from
               its rows (attend_new, kernels/_merge.py): the sglang backend's decode step ("side"),
               which joins at the next forward (more overlap than here)
  side-bf16    bf16_write_kv alone on the second stream, attend_new: the sglang "side" step since
               the INT2 codes are written per page (a step whose token completes no page)
  side-fill    side-bf16 + demote_pages_kv of one page after it on the second stream: a step whose
               token completes its page (1 step in 64 per request at page 64); the amortised step
               cost, side-bf16 + P(fill) x the difference, is tabled after the main table
  rotate       the BF16 copy stored by the q rotation's launch (store_new, kernels/rotate.py), then read
               from its slot: the sglang "rotate" step whose token completes no page
  rotate-fill  rotate + demote_pages_kv of one page on the second stream after the launch: the "rotate"
               step whose token completes its page (amortised like side-fill, tabled after the main table)
  rot serial   rot with the BF16 tier's launch after the CUDA INT2 tier (overlap_tiers=False; the
               others run it beside the INT2 tier)
  sglang serial  sglang, in series likewise (the writer programs' cost before the overlap)
and the stage-1 kernel's registers / spills per compiled variant (ptxas, via Triton).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_attention import (D, HKV, HQ, RECENT, SINK, _cache_copies, _commit, _fmt,  # noqa: E402
                              _free_int2_slots, _table, time_calls)

from oscar_ray._defaults import PAGE_SIZE as PAGE  # noqa: E402  (the serving page: a request completes one every 64 steps)
from oscar_ray.kernels import bf16_write_kv, demote_pages_kv, int2_decode_attention, int2_write_kv  # noqa: E402
from oscar_ray.kernels.decode_attention import _decode_stage1_kernel  # noqa: E402
from oscar_ray.kernels.side_stream import SideStream  # noqa: E402
from oscar_ray.kernels.synthetic import random_mixed_cache  # noqa: E402

FORMS = ["rot", "ring", "rot+bf16", "sglang", "separate", "bf16 side", "side", "side-bf16", "side-fill", "rotate",
         "rotate-fill", "rot serial", "sglang serial"]


def bench(batch: int, ctx: int, args, device: str) -> list[str]:
    n2 = ctx - SINK - RECENT
    # the serving default: fp16 scales and head-major pages, so the CUDA INT2 tier serves the launch
    # (until 2026-12-07 this ran fp32 scales, token-major: the Triton INT2 tier, one launch, ~2x slower)
    kv, seg = random_mixed_cache([n2] * batch, [SINK + RECENT] * batch, HKV, D, device=device,
                                 scale_dtype=torch.float16, head_major_scales=True, head_major_codes=True,
                                 int2_page_size=PAGE, bf16_page_size=PAGE)  # page 8 before the H200 round of 2026-12-07
    q = torch.randn(batch, HQ, D, device=device)
    new_k, new_v = (torch.randn(batch, HKV, D, device=device) for _ in "kv")
    r_k = torch.linalg.qr(torch.randn(D, D, device=device))[0].contiguous()
    int2_slot = _free_int2_slots(kv, seg, batch)
    last = seg.bf16_lens.long() - 1
    p16 = seg.bf16_page_table.gather(1, (last // kv.k_bf16.shape[1])[:, None])[:, 0].int()
    o16 = (last % kv.k_bf16.shape[1]).int()
    nbytes = kv.k_codes.numel() * 2 + kv.k_bf16.numel() * 4

    side = SideStream(device)

    def forms(copies, form):
        caches = _cache_copies(kv, seg, copies)
        extra = dict(k_rotation=r_k)
        if form == "ring":
            extra = dict(append_k=new_k, append_v=new_v)
        elif form.startswith("side"):
            extra.update(attend_new=(new_k, new_v))  # V absorbed: the rows are in the cache's V basis
        elif form.startswith("rotate"):  # V absorbed: stored as given, K rotated by R_K
            extra.update(store_new=(new_k, new_v, p16, o16))
        elif form not in ("rot", "separate", "bf16 side", "rot serial"):  # the in-launch forms
            extra.update(append_k=new_k, append_v=new_v, rotate_append=True)
            if form.startswith("sglang"):
                extra.update(append_int2=int2_slot, append_clip=(0.96, 0.0))
        if form.endswith("serial"):
            extra.update(overlap_tiers=False)

        def int2(c, both=False):  # both: the BF16 copy in the same launch (the sglang pool's oscar_write)
            int2_write_kv(new_k, new_v, r_k, None, 0.96, 0.0, *int2_slot, c[0].k_codes, c[0].k_scales,
                          c[0].v_codes, c[0].v_scales, bf16_copy=(p16, o16, c[0].k_bf16, c[0].v_bf16) if both else None)

        def bf16(c):
            bf16_write_kv(new_k, new_v, r_k, None, p16, o16, c[0].k_bf16, c[0].v_bf16)

        def fill(c):  # request 0's tail page into a free INT2 page: the page-completing step's extra launch
            demote_pages_kv(c[0].k_bf16, c[0].v_bf16, p16[:1], int2_slot[0][:1], c[0].k_codes, c[0].k_scales,
                            c[0].v_codes, c[0].v_scales, 0.96, 0.0)

        def call(c):
            if form == "side":
                side.run(lambda: int2(c, both=True))
            elif form == "side-bf16":
                side.run(lambda: bf16(c))
            elif form == "side-fill":
                side.run(lambda: (bf16(c), fill(c)))
            elif form == "bf16 side":
                side.run(lambda: int2(c))
                bf16(c)
            elif form == "separate":
                int2(c, both=True)
            out = int2_decode_attention(q, c[0], c[1], max_int2_len=n2, **extra)
            if form == "rotate-fill":  # after the launch that stored the page's last row
                side.run(lambda: fill(c))
            side.join()
            return out
        return [lambda c=c: call(c) for c in caches]

    times = [time_calls(lambda copies, f=f: forms(copies, f), nbytes, args) for f in args.forms]
    base = times[0][1]
    row = [str(batch), str(ctx)] + [f"{_fmt(t)} ({t[1] - base:+.1f})" if i else _fmt(t) for i, t in enumerate(times)]
    return row, {f: t[1] for f, t in zip(args.forms, times)}


def amortised(batch: int, med: dict[str, float], plain: str = "side-bf16", filled: str = "side-fill") -> list[str] | None:
    """An sglang decode step per step: the `plain` form plus the fill launch (`filled` - `plain`) on the
    share of steps where at least one of `batch` requests completes a page (lengths spread evenly:
    1 - (1 - 1/PAGE)^B); "side-bf16" / "side-fill" for the "side" form, "rotate" / "rotate-fill"."""
    if not {"rot", plain, filled} <= med.keys():
        return None
    p_fill = 1 - (1 - 1 / PAGE) ** batch
    step = med[plain] + p_fill * (med[filled] - med[plain])
    write = step - med["rot"]
    return [plain.split("-")[0], str(batch), f"{p_fill:.3f}", f"{step:.1f}", f"{write:+.1f}",
            f"{100 * write / med['rot']:.1f}%"]


def registers() -> list[str]:
    """n_regs / n_spills of each compiled stage-1 variant (append forms differ in constexprs)."""
    lines = []
    for dev_cache in getattr(_decode_stage1_kernel, "device_caches", {}).values():  # none interpreted
        for key, k in dev_cache[0].items():
            if getattr(k, "n_regs", None) is None:
                continue
            try:  # ASTSource.constants: {(arg index,): value} in Triton 3.x
                names = k.src.fn.arg_names
                consts = {names[i[0] if isinstance(i, tuple) else i]: v for i, v in k.src.constants.items()}
                tag = ", ".join(f"{n}={consts[n]}" for n in ("INT2W", "ROT_K", "CLIP_K", "SPLITS2", "SPLITS16"))
            except (AttributeError, IndexError, KeyError, TypeError):
                tag = str(key)[:120]
            lines.append(f"- {tag}: {k.n_regs} registers, {k.n_spills} spills")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, no CUDA graphs (CPU + TRITON_INTERPRET=1)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--forms", nargs="+", choices=FORMS, default=FORMS,
                   help="forms to time (rot, the baseline of the differences, is always timed first)")
    args = p.parse_args(argv)
    args.forms = ["rot"] + [f for f in args.forms if f != "rot"]
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.batches, args.context, args.repeats = [2], SINK + RECENT + 64, 2
    results = [bench(b, args.context, args, device) for b in args.batches]
    rows = [r for r, _ in results]
    amort = [a for pair in (("side-bf16", "side-fill"), ("rotate", "rotate-fill"))
             for a in (amortised(b, m, *pair) for b, (_, m) in zip(args.batches, results)) if a]
    amort_lines = ([f"Amortised sglang decode step (page {PAGE}): plain + P(fill) x (fill - plain) of a form's two "
                    "rows (side: side-bf16 / side-fill; rotate: rotate / rotate-fill), µs of medians; "
                    "write = step - rot, and its share of rot.", "",
                    *_table(["form", "batch", "P(fill)", "step µs", "write µs", "write / rot"], amort), ""]
                   if amort else [])
    card = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    lines = [f"# Decode append cost, {card}, {datetime.date.today()}, commit {_commit()}", "",
             "µs per launch, median (p20–p80), in parentheses the difference to `rot`.", "",
             *_table(["batch", "context", *[f"{f} µs" for f in args.forms]], rows), "", *amort_lines,
             *registers(), ""]
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
