"""One int2_decode_attention call at a given shape/config, for `ncu -k regex:_decode_stage1` profiling."""
import sys

import torch

from oscar_ray.kernels import int2_decode_attention
from oscar_ray.kernels.synthetic import random_mixed_cache

batch, ctx, bn, w, st, splits = (int(x) for x in sys.argv[1:7])
kv, seg = random_mixed_cache([ctx - 320] * batch, [320] * batch, 8, 128, scale_dtype=torch.float16, device="cuda")
q = torch.randn(batch, 32, 128, device="cuda")
for _ in range(2):
    int2_decode_attention(q, kv, seg, num_splits=splits, block_n=bn, num_warps=w, num_stages=st)
torch.cuda.synchronize()
