"""The launchers' own kernel specialisations compile for sm_90, captured from real calls on a CPU host.

test_compile_sm90.py compiles hand-written signatures; this one runs the launchers themselves, so
the argument types they really pass are what gets compiled.  The difference matters: without the
sglang write, int2_decode_attention passes fp32 placeholders for the append pointers, and a
branch that only looked dead (a runtime `if` on a value the compiler keeps as a tensor) was
compiled with them and failed on the H200 (2026-12-06) although every interpreter test and the
hand-written check (i32 placeholders) passed.

How: with TRITON_INTERPRET unset, a stand-in driver names an sm_90 target, and Triton's
jit_cache_hook compiles each new specialisation with triton.compile (PTX + the bundled ptxas, no
device) and returns True, so nothing is launched; the launchers' torch work runs on CPU tensors.
"""

import textwrap

import pytest

from .sm90 import ptxas_path, run_compiled

SCRIPT = textwrap.dedent('''
    import torch, triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime import driver

    TARGET = GPUTarget("cuda", 90, 32)

    class Sm90:  # what JITFunction.run asks of a driver before it compiles
        def get_current_device(self): return 0
        def get_current_stream(self, device=None): return 0
        def get_current_target(self): return TARGET
        def get_active_torch_device(self): return torch.device("cpu")
        def is_active(self): return True

    driver.set_active(Sm90())
    seen = {}

    def compile_instead_of_launch(*, key, fn, compile, **_):
        jf = fn.jit_function
        if (jf.__name__, str(key)) not in seen:
            src = ASTSource(jf, compile["signature"], compile["constants"], compile["configs"][0])
            k = triton.compile(src, target=TARGET, options={"num_warps": compile["num_warps"],
                                                            "num_stages": compile["num_stages"]})
            seen[(jf.__name__, str(key))] = k.metadata.shared
        return True  # skip Triton's own compile and the launch

    knobs.runtime.jit_cache_hook = compile_instead_of_launch

    from oscar_ray.kernels import (bf16_write_kv, demote_pages_kv, int2_decode_attention, int2_extend_attention,
                                   int2_write_kv)
    from oscar_ray.kernels.synthetic import random_mixed_cache

    hkv, hq, d = 8, 32, 128  # Qwen3-8B: the benchmarks' and the engines' geometry
    for scale_dtype in (torch.float16, torch.float32):
        for int2, bf16 in (([4096] * 2, [300] * 2), ([131072] * 8, [256] * 8)):  # short tile, long tile
            kv, seg = random_mixed_cache(int2, bf16, hkv, d, int2_page_size=16, bf16_page_size=16,
                                         scale_dtype=scale_dtype, spare_pages=4)
            b = len(int2)
            q = torch.randn(b, hq, d)
            r = torch.eye(d)
            k_new, v_new = torch.randn(b, hkv, d).bfloat16(), torch.randn(b, hkv, d).bfloat16()
            int2_decode_attention(q, kv, seg)  # plain
            int2_decode_attention(q, kv, seg, append_k=k_new, append_v=v_new)  # torch engine: ring write
            slot = torch.arange(b, dtype=torch.int32) + kv.k_codes.shape[0] - 4
            zero = torch.zeros(b, dtype=torch.int32)
            int2_decode_attention(q, kv, seg, k_rotation=r, append_k=k_new, append_v=v_new, rotate_append=True,
                                  append_int2=(slot, zero), append_clip=(0.95, 0.0))  # sglang: whole write
            int2_write_kv(k_new, v_new, r, None, 0.95, 0.0, slot, zero, kv.k_codes, kv.k_scales, kv.v_codes,
                          kv.v_scales)
            bf16_write_kv(k_new, v_new, r, None, slot % 4, zero, kv.k_bf16, kv.v_bf16)
            demote_pages_kv(kv.k_bf16, kv.v_bf16, zero[:1], slot[:1], kv.k_codes, kv.k_scales, kv.v_codes,
                            kv.v_scales, 0.95, 0.0)
    kv, seg = random_mixed_cache([4096], [256], hkv, d, int2_page_size=16, bf16_page_size=16,
                                 scale_dtype=torch.float16)
    for chunk in (64, 2048):  # the extend kernel's two block_m choices
        k_new, v_new = torch.randn(chunk, hkv, d).bfloat16(), torch.randn(chunk, hkv, d).bfloat16()
        int2_extend_attention(torch.randn(chunk, hq, d).bfloat16(), k_new, v_new, kv, seg, method="fused")
    for (name, _), shared in sorted(seen.items()):
        print(name, shared)
    print("COMPILED", len(seen))
''')


@pytest.mark.skipif(ptxas_path() is None, reason="triton has no bundled NVIDIA backend / ptxas")
def test_launcher_specialisations_compile_for_sm90():
    proc = run_compiled(SCRIPT, timeout=900)
    assert proc.returncode == 0 and "COMPILED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
    names = {line.split()[0] for line in proc.stdout.splitlines()[:-1]}
    # every kernel the calls above launch was compiled (a launcher that stopped reaching one fails here)
    assert {"_decode_stage1_kernel", "_decode_merge_kernel", "_extend_kernel"} <= names, proc.stdout
    assert len(names) >= 6, proc.stdout
