"""Run oscar_ray/kernels/int2_decode.cu on the CPU: g++ builds the kernel source with cuda_emu.h.

`run(plan)` executes a decode_cuda.launch_plan (the launcher's own grid, block and arguments) on CPU
tensors; builds are cached per specialisation under the pytest cache's tmp dir for the session.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from oscar_ray.kernels import decode_cuda

HERE = Path(__file__).parent
_BUILD = Path(tempfile.gettempdir()) / "oscar-cuda-emu"


def available() -> str | None:
    """Why the emulator cannot build here, or None."""
    return None if shutil.which("g++") else "g++ not found"


@functools.lru_cache(maxsize=None)
def _library(source_args: tuple, early: bool):
    source = decode_cuda.kernel_source(*source_args)
    deps = source + (HERE / "cuda_emu.h").read_text() + (HERE / "decode_emu.cpp").read_text()
    key = hashlib.sha256(f"{deps}{early}".encode()).hexdigest()[:16]
    _BUILD.mkdir(parents=True, exist_ok=True)
    lib = _BUILD / f"decode_{key}.so"
    if not lib.exists():
        src = _BUILD / f"kernel_{key}.cu"
        src.write_text(source)
        tmp = lib.with_suffix(".tmp.so")
        cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-fvisibility=hidden", "-fno-gnu-unique", "-DOSCAR_CPU_EMU",
               f"-DEMU_CP_EARLY={int(early)}", f'-DKERNEL_SOURCE="{src}"', f"-I{HERE}",
               str(HERE / "decode_emu.cpp"), "-o", str(tmp)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        tmp.rename(lib)  # atomic: a concurrent build of the same key sees a whole library or none
    so = ctypes.CDLL(str(lib))
    fn = so.emu_int2_decode
    fn.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_void_p), ctypes.c_double, ctypes.POINTER(ctypes.c_int)]
    fn.restype = None
    so.emu_error.restype = ctypes.c_char_p
    return fn, so.emu_error


def run(plan: decode_cuda.CudaLaunch, early: bool = False) -> None:
    """Execute `plan` (CPU tensors) as the GPU would, writing its mid_o / mid_lse rows in place."""
    for t in plan.tensors:
        if t.device.type != "cpu":
            raise ValueError("the emulator reads CPU tensors")
    fn, error = _library(plan.source_args, early)
    ptrs = (ctypes.c_void_p * 9)(*[t.data_ptr() for t in plan.tensors])
    ints = (ctypes.c_int * 10)(*plan.ints)
    keep = plan.tensors  # alive for the call
    fn(*plan.grid, plan.block[0], ptrs, plan.qk_scale, ints)
    del keep
    if error():  # a misused primitive (the GPU would hang or fault): the kernel's bug, not a wrong number
        raise RuntimeError(f"emulated kernel: {error().decode()}")


def partials(plan: decode_cuda.CudaLaunch) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan's mid_o / mid_lse tensors (the rows the kernel wrote are [.., :n_splits])."""
    return plan.tensors[7], plan.tensors[8]
