"""CPU unit tests of the Triton kernels run on Triton's interpreter (TRITON_INTERPRET=1).

The variable is read when @triton.jit decorates a function, so on a host without CUDA it is set
here, before any test module imports oscar_ray.kernels, and `pytest tests/unit` works without it on
the command line.  A CUDA host keeps compiled kernels for tests/gpu; pass it there explicitly.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _kernels_are_interpreted():
    from oscar_ray.kernels import write

    if type(write._int2_write_kernel).__name__ != "InterpretedFunction":
        pytest.skip("oscar_ray.kernels was imported before TRITON_INTERPRET=1 was set; "
                    "run: TRITON_INTERPRET=1 pytest tests/unit/kernels")
