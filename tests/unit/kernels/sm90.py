"""What the sm_90 compile checks share: triton's bundled ptxas, and a script run with the compiler on.

The checks run in a subprocess because TRITON_INTERPRET=1 (set for this suite) replaces every
@triton.jit function at import time; the child gets the environment without it.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[3]


def ptxas_path() -> Path | None:
    """triton's bundled ptxas (lowers PTX for sm_90 with no device), or None without it."""
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.exists() else None


def run_compiled(script: str, timeout: int) -> subprocess.CompletedProcess:
    """Run a Python script from the repository root with Triton's compiler (not its interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)
