"""CPU tests of the torch engine's and the TP stack's Triton path on Triton's interpreter.

TRITON_INTERPRET is read when @triton.jit decorates a function, so it is set here before any test
module imports oscar_ray.kernels (as tests/unit/kernels/conftest.py does); tests skip when the
kernels were already imported compiled.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def interpreted():
    from oscar_ray.kernels import write

    if type(write._int2_write_kernel).__name__ != "InterpretedFunction":
        pytest.skip("oscar_ray.kernels was imported before TRITON_INTERPRET=1 was set; "
                    "run: TRITON_INTERPRET=1 pytest tests/unit/interp")
