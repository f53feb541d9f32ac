"""SideStream without CUDA: the work runs at once, in series, and join has nothing to wait for."""

import pytest
import torch

from oscar_ray.kernels.side_stream import SideStream


def test_cpu_side_stream_runs_inline():
    side = SideStream("cpu")
    out = torch.zeros(3)
    x = torch.arange(3.0)
    side.run(lambda: out.copy_(x * 2), x)
    assert torch.equal(out, x * 2) and side.stream is None and not side.pending
    side.join()


def test_side_stream_propagates_the_work_s_error():
    def bad():
        raise ValueError("rows: wrong shape")

    with pytest.raises(ValueError, match="rows"):
        SideStream("cpu").run(bad)
