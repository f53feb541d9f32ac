"""Numeric defaults shared by the pydantic configs and the torch-only math.

Lives below every layer and imports nothing, so `oscar_ray.quant` and `oscar_ray.kernels` can use the
same numbers as `oscar_ray.config` on the GPU image, which has no pydantic.
"""

SINK_TOKENS = 64  # first tokens kept BF16: attention sinks carry most of the softmax mass
RECENT_TOKENS = 256  # last tokens kept BF16: the window decode attends to most
K_CLIP_RATIO = 0.96  # per-token quantile clip; d=128 clips the top 5 |values| of a key row
V_CLIP_RATIO = 0.92  # d=128 clips the top 10 |values| of a value row
SCALE_DTYPE = "float16"  # 16-bit scale/zero: 2.25 bits/element at d=128 (fp32 gives 2.5)
KEY_BITS = (2, 3)  # key code widths of the history tier: INT2, or a third bit plane
PAGE_SIZE = 64  # tokens per page; sink and recent windows are whole pages
# INT2 pages' memory order: head-major decodes 1.50x faster on an H100 at bs 8 x 128K (240.6 vs 361.9 us;
# token-major pages hold the CUDA tier at the L2's throughput), benchmarks/results/decode_h200.md
PAGE_LAYOUT = "head"
CALIB_TOKENS_PER_LAYER = 30_000  # authors' DUMP_KVCACHE_TOKENS budget
