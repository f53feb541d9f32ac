"""SideStream: launches run on a second CUDA stream beside the current one, joined when read.

Two users.  int2_decode_attention runs the BF16 tier's launch beside the CUDA INT2 tier and joins
before the merge, which reads both.  The sglang backend runs a decode step's writes (the BF16
copy, and the INT2 codes of the pages the step completes; the per-token INT2 write they replace was
8.7-9.4 µs per layer and step at bs 1-32 on an H100, decode_h200.md) beside the attention and joins
at the next forward: the step attends its new token from its rows, and the INT2 codes are first
read when the window moves on or by a radix-cache hit.  Both leave most SMs idle
at small batches (bs 1: 8 KV heads x a few splits of CTAs), which the side work fills.

Ordering: `run` makes the side stream wait for everything queued on the current stream so far (the
inputs), and marks the tensors it names as used there, so the caching allocator does not hand their
memory out again before the side work ran.  `join` makes the current stream wait for the side work;
call it before anything may read what the side work writes (the backend: at each forward's start).
Without CUDA (CPU, the interpreter) `run` calls the function at once: the same results, in series.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class SideStream:
    """A second CUDA stream on `device` for work joined later (see the module docstring)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.pending = False

    def run(self, fn: Callable[[], object], *tensors: torch.Tensor) -> None:
        """Queue fn() on the side stream after the current stream's work so far; `tensors`: the
        inputs allocated on the current stream that fn reads (kept alive until it ran)."""
        if self.stream is None:
            fn()
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            fn()
        for t in tensors:
            t.record_stream(self.stream)
        self.pending = True

    def join(self) -> None:
        """The current stream waits for all side work queued so far (no host sync)."""
        if self.pending:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            self.pending = False
