"""int2_decode_attention at one shape, for `ncu -k regex:oscar_int2` (CUDA tier) or `regex:_decode_stage1` (Triton).

    python3 benchmarks/ncu_decode.py BATCH CTX BLOCK_N WARPS STAGES SPLITS [--layout head-pages] [--copies 2] [--read-only]
        [--pipe 5] [--lookahead] [--min-blocks 3] [--kchains 2] [--page-ahead 2]

BLOCK_N / WARPS / STAGES are the Triton stage 1's; SPLITS 0 takes the launcher's default split rule; --layout / --copies / --read-only pick the CUDA
tier's variant (decode_cuda_sweep.py's meanings: copies 1 half_rows, 2 bulk; read_only the copy
ceiling), so one device call can profile the default ring beside its ceiling and the bulk refills.
"""
import argparse
from functools import partial

import torch

import oscar_ray.kernels.decode_attention as dec
from oscar_ray._defaults import PAGE_SIZE
from oscar_ray.kernels import int2_decode_attention
from oscar_ray.kernels.synthetic import random_mixed_cache

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
for name in ("batch", "ctx", "block_n", "warps", "stages", "splits"):
    p.add_argument(name, type=int)
p.add_argument("--layout", choices=["token", "head-pages"], default="token")
p.add_argument("--copies", type=int, choices=[0, 1, 2], default=0)
p.add_argument("--read-only", action="store_true")
p.add_argument("--pipe", type=int, default=None, help="the CUDA tier's ring depth (default: the launcher's)")
p.add_argument("--lookahead", action="store_true", help="the ring loop with step i + 1's scores beside step i's P'·V")
p.add_argument("--min-blocks", type=int, default=None, help="CTAs per SM the CUDA tier's registers are capped for")
p.add_argument("--kchains", type=int, default=1, help="dependent MMA chains per tile for the CUDA tier's scores (1, 2)")
p.add_argument("--page-ahead", type=int, default=1, help="steps between a ring refill's page-id load and its copies")
p.add_argument("--calls", type=int, default=2)
p.add_argument("--page", type=int, default=PAGE_SIZE, help="tokens per page, both tiers (the serving default; 8 before the H200 round of 2026-12-07)")
a = p.parse_args()
head = a.layout == "head-pages"
kv, seg = random_mixed_cache([a.ctx - 320] * a.batch, [320] * a.batch, 8, 128, scale_dtype=torch.float16,
                             device="cuda", head_major_scales=head, head_major_codes=head,
                             int2_page_size=a.page, bf16_page_size=a.page)
q = torch.randn(a.batch, 32, 128, device="cuda")
# the refill by cuda_copies (int2_decode_attention passes half_rows / bulk itself, over a partial's)
dec.int2_tier_cuda = partial(dec.int2_tier_cuda, read_only=a.read_only, pipe=a.pipe, lookahead=a.lookahead,
                             min_blocks=a.min_blocks, kchains=a.kchains, page_ahead=a.page_ahead)
for _ in range(a.calls):
    int2_decode_attention(q, kv, seg, num_splits=a.splits or None, block_n=a.block_n, num_warps=a.warps, num_stages=a.stages,
                          cuda_copies=("lane", "half_rows", "bulk")[a.copies])
torch.cuda.synchronize()
