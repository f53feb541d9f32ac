"""The CUDA decode kernel (kernels/decode_cuda.py) compiles for sm_90 on a CPU host, without spills.

Its numbers are checked on the CPU by the emulator (test_decode_cuda_emu.py) and on the GPU
(tests/gpu/test_kernels_gpu.py); here, what only the real toolchain shows: every specialisation the
launcher builds goes through NVRTC (the nvidia-cuda-nvrtc wheel of the dev extra, the same compiler
torch.cuda._compile_kernel calls on the GPU host) to PTX for compute_90, then through Triton's
bundled ptxas for sm_90; registers must fit the launch bounds with no local memory.
"""

import ctypes
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oscar_ray.kernels import decode_cuda

from .sm90 import ptxas_path


def _nvrtc():
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("nvidia-cuda-nvrtc-cu12 (dev extra) not installed")
    libs = sorted(Path(list(spec.submodule_search_locations)[0], "lib").glob("libnvrtc.so.*"))
    return ctypes.CDLL(str(libs[0]))


def _ptxas() -> str:
    path = ptxas_path()
    if path is None:
        pytest.skip("triton wheel without a bundled ptxas")
    return str(path)


def _compile(lib, source: str) -> bytes:
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"decode.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17"]
    res = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert res == 0, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value


LA, KC2 = {"lookahead": True}, {"kchains": 2}


@pytest.mark.parametrize("gqa, page, warps, pipe, half_rows, opts", [
    (1, 8, 4, 0, False, {}), (3, 16, 4, 0, False, {}), (4, 8, 4, 0, False, {}), (4, 64, 4, 0, False, {}),
    (8, 8, 4, 0, False, {}), (12, 8, 4, 0, False, {}), (16, 32, 4, 0, False, {}), (4, 8, 8, 0, False, {}),
    (4, 8, 2, 0, False, {}), (4, 8, 4, 4, False, {}), (12, 16, 4, 3, False, {}), (1, 8, 2, 6, False, {}),
    (4, 8, 4, 4, True, {}), (4, 16, 2, 6, True, {}), (4, 64, 4, 4, False, LA), (4, 64, 4, 5, False, LA),
    (12, 16, 4, 4, False, LA), (4, 64, 4, 4, False, KC2), (4, 64, 4, 5, False, {**LA, **KC2}), (4, 8, 4, 0, False, KC2),
    (4, 64, 4, 4, False, {"page_ahead": 2}), (4, 8, 4, 4, True, {"page_ahead": 2})])
def test_cuda_decode_compiles_for_sm90_without_spills(tmp_path, gqa, page, warps, pipe, half_rows, opts):
    ptx = _compile(_nvrtc(), decode_cuda.kernel_source(gqa, page, warps, pipe=pipe, half_rows=half_rows, **opts))
    assert decode_cuda.KERNEL_NAME.encode() in ptx
    (tmp_path / "k.ptx").write_bytes(ptx)
    out = subprocess.run([_ptxas(), "-arch=sm_90", "-v", "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, check=True)
    info = out.stdout + out.stderr
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    stack = int(re.search(r"(\d+) bytes stack frame", info).group(1))
    assert spills == [0, 0] and stack == 0, info
    nt = -(-gqa // 8)
    assert regs <= 65536 // (32 * warps * decode_cuda._min_blocks(nt, warps, pipe)), info


@pytest.mark.parametrize("half_rows, bulk", [(False, False), (True, False), (False, True)])
def test_read_only_ceiling_compiles_for_sm90(tmp_path, half_rows, bulk):
    # the benchmarks' copy ceiling must build for the card it is meant to measure, and run at the
    # kernel's residency: 4 CTAs per SM fit Hopper's 228 KB of shared memory (+1 KB each), 5 do not
    ptx = _compile(_nvrtc(), decode_cuda.kernel_source(4, 8, 4, code_tok=32 if bulk else 256, scale_tok=2 if bulk else 16,
                                                       pipe=4, half_rows=half_rows, read_only=True, bulk=bulk))
    assert decode_cuda.KERNEL_NAME.encode() in ptx and b"mma.sync" not in ptx
    assert (b"cp.async.bulk" in ptx) == bulk and (b"cp.async.cg" in ptx) != bulk
    (tmp_path / "k.ptx").write_bytes(ptx)
    out = subprocess.run([_ptxas(), "-arch=sm_90", "-v", "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, check=True)
    smem = int(re.search(r"(\d+) bytes smem", out.stdout + out.stderr).group(1)) + 1024
    assert 4 * smem <= 228 * 1024 < 5 * smem, out.stdout + out.stderr


@pytest.mark.parametrize("gqa, page, warps, pipe", [(4, 8, 4, 4), (4, 64, 4, 4), (12, 16, 4, 3), (1, 32, 2, 6)])
def test_bulk_ring_compiles_for_sm90_without_spills(tmp_path, gqa, page, warps, pipe):
    # cp.async.bulk + mbarrier tx counts are sm_90 PTX: ptxas checks the asm, and the registers fit
    ptx = _compile(_nvrtc(), decode_cuda.kernel_source(gqa, page, warps, code_tok=32, scale_tok=2, pipe=pipe, bulk=True))
    assert b"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx and b"cp.async.cg" not in ptx
    (tmp_path / "k.ptx").write_bytes(ptx)
    out = subprocess.run([_ptxas(), "-arch=sm_90", "-v", "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, check=True)
    info = out.stdout + out.stderr
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    assert [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)] == [0, 0], info
    assert regs <= 65536 // (32 * warps * decode_cuda._min_blocks(-(-gqa // 8), warps, pipe)), info


@pytest.mark.parametrize("gqa, pipe, lookahead", [(4, 0, False), (4, 4, False), (12, 0, False), (4, 4, True)])
def test_sass_cost_model_walks_the_main_loop(gqa, pipe, lookahead):
    # benchmarks/cuda_sass_count.py's walk of the loop's common path: a 32-token step is 16 QK and 16
    # PV MMAs per n-tile, and the register path's loop body holds two steps (lookahead's body: step
    # i's P'·V and step i + 1's scores, an if / else whose last-step side has the P'·V alone)
    _nvrtc(), _ptxas()
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import cuda_sass_count

    listing, _ = cuda_sass_count.sass(decode_cuda.kernel_source(gqa, 8, 4, pipe=pipe, lookahead=lookahead))
    path = cuda_sass_count.loop_path(listing)
    steps, nt = (1 if pipe else 2), -(-gqa // 8)
    assert sum(op.startswith("HMMA") for op in path) == 32 * steps * nt
    assert sum(op.startswith("MUFU.EX2") for op in path) >= 8 * steps * nt  # p = 2^(s - m): 8 scores a lane
    assert 10 * 32 * steps < len(path) < 40 * 32 * steps
