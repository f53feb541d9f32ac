"""Tests against the real sglang 0.5.23 classes (the `oscar-ray[sglang]` extra, own venv: README.md).

Each module starts with pytest.importorskip("sglang"), so without sglang the directory is skipped.
The OSCAR kernels run on Triton's interpreter on a CPU host: TRITON_INTERPRET is set before any
module imports oscar_ray.kernels.  The plugin's settings come from OSCAR_* variables, as in every
sglang process; the tests use plain INT2 rotations-off ("identity") unless they pass others.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OSCAR_ROTATIONS", "identity")


@pytest.fixture(scope="session")
def plugins_loaded():
    """sglang's own loader, as launch_server / Engine / every scheduler run it."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return True
