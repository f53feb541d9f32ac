"""Offline cost model of the CUDA INT2-tier decode kernel: SASS instructions per token-head.

No GPU needed: NVRTC (the nvidia-cuda-nvrtc wheel of the dev extra) compiles each specialisation to
PTX, Triton's bundled ptxas to sm_90 SASS, nvdisasm lists it.  The main loop's common path is walked
from its head to the backward branch: forward branches are followed when they skip a block that is
mostly FMULs or is guarded by a VOTE.ANY (the online-softmax rescale, which `__any_sync(big)` runs only
when a score tops the lazy reference by 2^8: a split's first step and a few more) and
not otherwise (every load of a full step is taken); BRA.DIV (taken by a diverged warp) never is.  Instructions on that path / tokens it covers =
warp-instructions per token of one KV head.  With the H200's 4 schedulers x 132 SMs x 1.98 GHz and
72 bytes per token-head (codes + fp16 scales), an issue rate r per scheduler-cycle bounds the
kernel at r x 1.045e12 / n x 72 B/s (n instructions per token-head):

    .venv/bin/python benchmarks/cuda_sass_count.py [--configs 4:8:4:0 4:8:4:4 ...]   (gqa:page:warps:pipe[:copies[:lookahead[:min_blocks[:kchains]]]])

copies (ring only): 0 one token per lane (default), 1 half_rows, 2 bulk (head-major pages, cp.async.bulk);
lookahead 1 (ring only): step i + 1's scores beside step i's P'·V; min_blocks 0: the launcher's; kchains 1 / 2:
dependent MMA chains per tile for the scores.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oscar_ray.kernels import decode_cuda  # noqa: E402

ISSUE_PER_S = 4 * 132 * 1.98e9  # H200 warp-instructions issued per second at one per scheduler-cycle
BYTES_PER_TOKEN_HEAD = 72  # 32 B K codes + 32 B V codes + 2 x 4 B fp16 (s, z)
_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")


def _tools():
    import triton
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    if spec is None:
        raise SystemExit("needs nvidia-cuda-nvrtc-cu12 (pip install -e '.[dev]')")
    lib = sorted(Path(list(spec.submodule_search_locations)[0], "lib").glob("libnvrtc.so.*"))[0]
    return ctypes.CDLL(str(lib)), Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def sass(source: str) -> tuple[str, int]:
    """(nvdisasm listing, registers) of one kernel source for sm_90."""
    nvrtc, bin_dir = _tools()
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17"]
    if nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)) != 0:
        n = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.value.decode())
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_bytes(ptx.value)
        info = subprocess.run([str(bin_dir / "ptxas"), "-arch=sm_90", "-v", "-o", f"{d}/k.cubin", f"{d}/k.ptx"],
                              capture_output=True, text=True, check=True)
        listing = subprocess.run([str(bin_dir / "nvdisasm"), "-c", f"{d}/k.cubin"], capture_output=True, text=True,
                                 check=True).stdout
    regs = int(re.search(r"Used (\d+) registers", info.stdout + info.stderr).group(1))
    return listing, regs


def _parse(listing: str):
    """[(address, predicate, opcode, operands)] and {label: index of the next instruction}."""
    ins, labels = [], {}
    for line in listing.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INS.search(line)
        if m:
            ins.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4)))
    return ins, labels


def _is_jump(ins_row) -> bool:
    """An unpredicated branch to a label (the end of an if's side, jumping over its else)."""
    _, pred, op, ops = ins_row
    return op == "BRA" and not pred and "(.L_x_" in ops


def loop_path(listing: str) -> list[str]:
    """Opcodes on the common path of the largest loop (see the module docstring)."""
    ins, labels = _parse(listing)
    target = lambda ops: re.search(r"\((\.L_x_\d+)\)", ops).group(1)  # noqa: E731
    # a loop ends in a predicated backward branch (an unconditional one returns from a BRA.DIV detour)
    loops = [(i, labels[target(ops)]) for i, (_, pred, op, ops) in enumerate(ins)
             if op == "BRA" and pred and "(.L_x_" in ops and labels[target(ops)] <= i]
    end, head = max(loops, key=lambda x: x[0] - x[1])
    path, i = [], head
    while i < end:
        _, pred, op, ops = ins[i]
        path.append(op)
        if op.startswith("BRA") and not op.startswith("BRA.DIV") and "(.L_x_" in ops:  # .DIV: diverged warps only
            j = labels[target(ops)]
            skipped = [o for _, _, o, _ in ins[i + 1:j]]
            if pred and head < j <= end and j - 1 > i and _is_jump(ins[j - 1]) and j <= labels[target(ins[j - 1][3])] <= end:
                # an if / else (the fall-through side ends in a jump past the other): the side with
                # more MMAs (lookahead's last step has no next-step scores), on a tie the shorter
                # (a full step's side, without the tail's token masks)
                k = labels[target(ins[j - 1][3])]
                other = [o for _, _, o, _ in ins[j:k]]
                mmas = lambda ops_: sum(o.startswith("HMMA") for o in ops_)  # noqa: E731
                if (mmas(other), -len(other)) > (mmas(skipped[:-1]), -len(skipped[:-1])):
                    i = j
                    continue
                i += 1
                continue
            fmul_block = head < j <= end and skipped and sum(o.startswith("FMUL") for o in skipped) > len(skipped) / 2
            rare = head < j <= end and i > 0 and ins[i - 1][2].startswith("VOTE.ANY")  # if (__any_sync(big))
            if not pred or fmul_block or rare:
                i = j
                continue
        i += 1
    return path


def _class(op: str) -> str:
    for key, name in (("HMMA", "mma"), ("LOP3", "lop3"), ("PRMT", "prmt"), ("LDGSTS", "cp.async"), ("LDG", "ld.global"),
                      ("LDS", "ld.shared"), ("MUFU", "ex2"), ("SHFL", "shfl"), ("MOVM", "movmatrix"),
                      ("F2F", "cvt"), ("F2FP", "cvt"), ("HADD2", "cvt"), ("FMUL", "fp32"), ("FFMA", "fp32"),
                      ("FADD", "fp32"), ("FMNMX", "fp32"), ("FSEL", "fp32"), ("FSET", "fp32")):
        if op.startswith(key):
            return name
    return "int/other"


def report(gqa: int, page: int, warps: int, pipe: int, copies: int = 0, lookahead: int = 0, min_blocks: int = 0,
           kchains: int = 1) -> str:
    bulk = copies == 2
    listing, regs = sass(decode_cuda.kernel_source(gqa, page, warps, min_blocks or None, pipe=pipe, half_rows=copies == 1,
                                                   bulk=bulk, code_tok=32 if bulk else 256, scale_tok=2 if bulk else 16,
                                                   lookahead=bool(lookahead), kchains=kchains))
    path = loop_path(listing)
    tokens = decode_cuda.STEP * (1 if pipe else 2)  # the register path's loop body is two steps
    per = len(path) / tokens
    classes = collections.Counter(_class(op) for op in path)
    mix = ", ".join(f"{k} {v / tokens:.2f}" for k, v in classes.most_common())
    bound = lambda r: r * ISSUE_PER_S / per * BYTES_PER_TOKEN_HEAD / 1e12  # noqa: E731
    return (f"| {gqa}:{page}:{warps}:{pipe}:{copies}:{lookahead}:{min_blocks}:{kchains} | {regs} | {len(path)} / {tokens} | {per:.1f} | "
            f"{bound(1.0):.2f} / {bound(0.43):.2f} | {mix} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["4:8:4:0", "4:8:4:4", "4:8:4:3", "12:8:4:0", "4:8:2:6"])
    args = p.parse_args()
    print("| gqa:page:warps:pipe:copies:lookahead:min_blocks:kchains | registers | loop path instr / tokens | per token-head | TB/s at 1.0 / 0.43 "
          "issue per scheduler-cycle | per token-head by class |")
    print("|---|---|---|---|---|---|")
    for c in args.configs:
        print(report(*map(int, c.split(":"))))


if __name__ == "__main__":
    main()
