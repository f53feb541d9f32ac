"""Device time of the kernels a callable launches (torch.profiler, CUDA activity): total and top-k.

Sum of self device time over all kernels per call: what the GPU is busy with.  Far under the
wall-clock step time means the step is bound by the host (Python, launches), not the GPU.
"""

from __future__ import annotations

import torch


def kernel_time(fn, n: int = 3, top: int = 0) -> dict:
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    out = {"gpu_ms": sum(e.self_device_time_total for e in ev) / n / 1e3}
    if top:
        ev.sort(key=lambda e: -e.self_device_time_total)
        out["top"] = [[e.key[:70], round(e.self_device_time_total / n / 1e3, 4), e.count // n] for e in ev[:top]]
    return out
