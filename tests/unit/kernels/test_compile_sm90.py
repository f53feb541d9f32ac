"""Every kernel specialisation the launchers use compiles for sm_90 (H200), on a CPU host.

The interpreter never runs Triton's GPU compiler, so layout / tl.dot shape / register-allocation
errors would otherwise surface only on the GPU.  triton.compile with an explicit GPUTarget lowers
to PTX and runs the bundled ptxas, which needs no device.  It runs in a subprocess because
TRITON_INTERPRET=1 (set for this suite) replaces every @triton.jit function at import time.
"""

import textwrap

import pytest

from .sm90 import ptxas_path, run_compiled

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from oscar_ray.kernels import decode_attention as da, demote, extend_attention as ea, rotate, write, write_bf16

    def check(fn, types, constexprs, num_warps=4, num_stages=2, max_shared=None):
        if fn is da._decode_stage1_kernel:
            constexprs = {"APPEND": False, "ROT_K": False, "ROT_V": False, "KC": 16, "INT2W": False, "CLIP_K": False,
                          "IDX_K": 0, "CLIP_V": False, "IDX_V": 0, "SCALE_FP16": False, "NEW": False,
                          **constexprs}
        sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
        k = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": num_warps, "num_stages": num_stages})
        shared = k.metadata.shared
        assert max_shared is None or shared <= max_shared, (fn.__name__, constexprs, shared)
        print(fn.__name__, {k: v for k, v in constexprs.items() if k in ("PRECISION", "GS", "INT2")}, shared)

    P = lambda t: "*" + t
    # int2_write_kv's bf16_copy slots and pages (BF16_OUT; unused pointers when it is off)
    copy_ptrs = dict(bp_ptr=P("i32"), bo_ptr=P("i32"), bk_ptr=P("bf16"), bv_ptr=P("bf16"))
    for fp16, gs, bits in ((True, 128, 2), (False, 64, 2), (True, 128, 3)):
        check(write._int2_write_kernel, dict(xk_ptr=P("bf16"), xv_ptr=P("bf16"), rk_ptr=P("fp32"), rv_ptr=P("fp32"),
              page_ptr=P("i32"), off_ptr=P("i32"), kc_ptr=P("u8"), ks_ptr=P("fp16" if fp16 else "fp32"),
              vc_ptr=P("u8"), vs_ptr=P("fp16" if fp16 else "fp32"), **copy_ptrs),
              dict(D=128, GS=gs, BR=16, KC=16, ROTATE_K=True, CLIP_K=True, CLIP_IDX_K=122, BITS_K=bits,
                   ROTATE_V=False, CLIP_V=False, CLIP_IDX_V=127, SCALE_FP16=fp16, BF16_OUT=bits == 2))
    check(write_bf16._bf16_write_kernel, dict(xk_ptr=P("bf16"), xv_ptr=P("bf16"), rk_ptr=P("fp32"), rv_ptr=P("fp32"),
          page_ptr=P("i32"), off_ptr=P("i32"), ok_ptr=P("bf16"), ov_ptr=P("bf16")),
          dict(D=128, BR=16, CN=32, ROTATE_K=True, ROTATE_V=False))
    for hq, hkv, d in ((32, 8, 128), (12, 1, 64)):  # q·R_K (+ k·R_K) ahead of the decode launch
        check(rotate._rotate_qk_kernel, dict(q_ptr=P("bf16"), k_ptr=P("bf16"), r_ptr=P("fp32"), qo_ptr=P("fp32"),
              ko_ptr=P("fp32")), dict(HQ=hq, HKV=hkv, D=d, BR=16, CN=32, KEYS=True, STORE=0, ROTATE_V=False))
    # ... and with the sglang "rotate" decode form's store of the step's rows (K and V, V absorbed)
    check(rotate._rotate_qk_kernel, dict(q_ptr=P("bf16"), k_ptr=P("bf16"), r_ptr=P("fp32"), qo_ptr=P("fp32"),
          ko_ptr=P("fp32"), xk_ptr=P("bf16"), xv_ptr=P("bf16"), rv_ptr=P("fp32"), page_ptr=P("i32"),
          off_ptr=P("i32"), ok_ptr=P("bf16"), ov_ptr=P("bf16")),
          dict(HQ=32, HKV=8, D=128, BR=16, CN=32, KEYS=False, STORE=2, ROTATE_V=False))
    check(write._rotate_rows_kernel, dict(xa_ptr=P("bf16"), xb_ptr=P("bf16"), ra_ptr=P("fp32"), rb_ptr=P("fp32"),
          out_ptr=P("fp32")), dict(H=8, D=128, BR=16, CN=32))
    check(write._int2_write_kernel, dict(xk_ptr=P("fp32"), xv_ptr=P("fp32"), rk_ptr=P("fp32"), rv_ptr=P("fp32"),
          page_ptr=P("i32"), off_ptr=P("i32"), kc_ptr=P("u8"), ks_ptr=P("fp16"), vc_ptr=P("u8"), vs_ptr=P("fp16"),
          **copy_ptrs), dict(D=128, GS=128, BR=16, KC=16, ROTATE_K=False, CLIP_K=True, CLIP_IDX_K=122, BITS_K=2,
               ROTATE_V=False, CLIP_V=False, CLIP_IDX_V=127, SCALE_FP16=True, BF16_OUT=True))  # two_pass's 2nd
    for bits, clip_v in ((2, False), (3, True)):  # CLIP_IDX 122 walks down from the max, 60 bisects
        check(demote._demote_pages_kernel, dict(sk_ptr=P("bf16"), sv_ptr=P("bf16"), src_ids_ptr=P("i32"),
              dst_ids_ptr=P("i32"), kc_ptr=P("u8"), ks_ptr=P("fp32"), vc_ptr=P("u8"), vs_ptr=P("fp32")),
              dict(D=128, GS=128, BR=8, TB=1, CLIP_K=True, CLIP_IDX_K=122, BITS_K=bits, CLIP_V=clip_v,
                   CLIP_IDX_V=60, SCALE_FP16=False))
    d1 = dict(q_ptr=P("fp32"), kc_ptr=P("u8"), ks_ptr=P("fp32"), vc_ptr=P("u8"), vs_ptr=P("fp32"), t2_ptr=P("i32"),
              l2_ptr=P("i32"), kb_ptr=P("bf16"), vb_ptr=P("bf16"), t16_ptr=P("i32"), l16_ptr=P("i32"),
              mid_o_ptr=P("fp32"), mid_lse_ptr=P("fp32"), qk_scale="fp32", ak_ptr=P("fp32"), av_ptr=P("fp32"),
              rk_ptr=P("fp32"), rv_ptr=P("fp32"), ap_ptr=P("i32"), ao_ptr=P("i32"))
    for prec in ("bf16", "fp16", "tf32", "ieee"):
        # the default layout (one group) must stay light: 3+ programs of 4 warps per SM need <= 48 KB each
        # (tf32 / ieee, for checks, stage fp32 operands: 84 KB at these defaults)
        check(da._decode_stage1_kernel, d1, dict(GQA=4, PAGE2=8, PAGE16=8, D=128, GS=128, SPLITS2=17, SPLITS16=4,
              BLOCK_H=16, BLOCK_N2=128, BLOCK_N16=64, PRECISION=prec, KEY_BITS=2), num_stages=3,
              max_shared=48 << 10 if prec in ("bf16", "fp16") else None)
    # 3-bit keys at the launcher's defaults (factored path, generic key unpack)
    check(da._decode_stage1_kernel, d1, dict(GQA=4, PAGE2=8, PAGE16=8, D=128, GS=128, SPLITS2=17, SPLITS16=4,
          BLOCK_H=16, BLOCK_N2=128, BLOCK_N16=64, PRECISION="bf16", KEY_BITS=3), num_stages=3, max_shared=64 << 10)
    for prec in ("bf16", "ieee"):  # several groups per row: the launcher's 64 / 2 default fits the 227 KB
        check(da._decode_stage1_kernel, d1, dict(GQA=4, PAGE2=8, PAGE16=8, D=128, GS=64, SPLITS2=17, SPLITS16=4,
              BLOCK_H=16, BLOCK_N2=64, BLOCK_N16=64, PRECISION=prec, KEY_BITS=2), num_stages=2,
              max_shared=227 << 10)
    check(da._decode_stage1_kernel, dict(d1, ks_ptr=P("fp16"), vs_ptr=P("fp16")), dict(GQA=12, PAGE2=8, PAGE16=8,
          D=64, GS=32, SPLITS2=4, SPLITS16=2, BLOCK_H=16, BLOCK_N2=64, BLOCK_N16=64, PRECISION="bf16", KEY_BITS=3))
    # the launcher's short-work tile (default_block_n) at its default stages
    check(da._decode_stage1_kernel, d1, dict(GQA=4, PAGE2=8, PAGE16=8, D=128, GS=128, SPLITS2=63, SPLITS16=8,
          BLOCK_H=16, BLOCK_N2=64, BLOCK_N16=64, PRECISION="bf16", KEY_BITS=2), num_stages=3, max_shared=48 << 10)
    # the fused ring write (the torch engine's decode steps)
    check(da._decode_stage1_kernel, d1, dict(GQA=4, PAGE2=8, PAGE16=8, D=128, GS=128, SPLITS2=17, SPLITS16=4,
          BLOCK_H=16, BLOCK_N2=128, BLOCK_N16=64, PRECISION="bf16", KEY_BITS=2, APPEND=True), num_stages=3,
          max_shared=48 << 10)
    # the sglang decode step in the launch: rotate, BF16 + INT2 (clip) stores of the new token
    check(da._decode_stage1_kernel, dict(d1, ks_ptr=P("fp16"), vs_ptr=P("fp16"), ak_ptr=P("bf16"), av_ptr=P("bf16")),
          dict(GQA=4, PAGE2=16, PAGE16=16, D=128, GS=128, SPLITS2=17, SPLITS16=4, BLOCK_H=16, BLOCK_N2=128,
               BLOCK_N16=64, PRECISION="bf16", KEY_BITS=2, APPEND=True, ROT_K=True, INT2W=True, CLIP_K=True,
               IDX_K=122, SCALE_FP16=True), num_stages=3, max_shared=48 << 10)
    # the sglang backend's "side" form: the BF16 tier leaves the new token's slot unread
    check(da._decode_stage1_kernel, d1, dict(GQA=4, PAGE2=16, PAGE16=16, D=128, GS=128, SPLITS2=17, SPLITS16=4,
          BLOCK_H=16, BLOCK_N2=128, BLOCK_N16=64, PRECISION="bf16", KEY_BITS=2, NEW=True), num_stages=3,
          max_shared=48 << 10)
    m = dict(mid_o_ptr=P("fp32"), mid_lse_ptr=P("fp32"), out_ptr=P("fp32"), q_ptr=P("bf16"), nk_ptr=P("bf16"),
             nv_ptr=P("bf16"), l16_ptr=P("i32"), qk_scale="fp32")
    for new in (False, True):  # ... and the merge scores it from its rows
        check(da._decode_merge_kernel, m, dict(D=128, BLOCK_S=128, GQA=4, NEW=new))
    e = dict(q_ptr=P("bf16"), kn_ptr=P("bf16"), vn_ptr=P("bf16"), kc_ptr=P("u8"), ks_ptr=P("fp32"), vc_ptr=P("u8"),
             vs_ptr=P("fp32"), kb_ptr=P("bf16"), vb_ptr=P("bf16"), t2_ptr=P("i32"), l2_ptr=P("i32"), t16_ptr=P("i32"),
             l16_ptr=P("i32"), indptr_ptr=P("i32"), out_ptr=P("fp32"), qk_scale="fp32")
    for prec, gs, kb, bm in (("bf16", 128, 2, 128), ("tf32", 64, 2, 64), ("bf16", 128, 3, 128), ("bf16", 128, 2, 64)):
        check(ea._extend_kernel, e, dict(GQA=4, PAGE2=8, PAGE16=8, D=128, GS=gs, BLOCK_M=bm, BLOCK_N=32,
              PRECISION=prec, KEY_BITS=kb), num_stages=3)  # the launcher's block_m (128, 64 for short chunks)
    from oscar_ray.kernels import extend_dequant as ed
    g = dict(kc_ptr=P("u8"), ks_ptr=P("fp16"), vc_ptr=P("u8"), vs_ptr=P("fp16"), kb_ptr=P("bf16"), vb_ptr=P("bf16"),
             kn_ptr=P("bf16"), vn_ptr=P("bf16"), t2_ptr=P("i32"), l2_ptr=P("i32"), t16_ptr=P("i32"), l16_ptr=P("i32"),
             qo_ptr=P("i32"), kvo_ptr=P("i64"), ok_ptr=P("bf16"), ov_ptr=P("bf16"))
    for kb, gs, out in ((2, 128, 0), (3, 128, 0), (2, 64, 2)):  # the extend gather: bf16 out, 3-bit keys, fp32 groups
        g2 = dict(g, ok_ptr=P("fp32"), ov_ptr=P("fp32")) if out == 2 else g
        check(ed._gather_kv_kernel, g2, dict(PAGE2=8, PAGE16=8, D=128, GS=gs, BT=64, KEY_BITS=kb, OUT=out))
    print("ALL OK")
''')


@pytest.mark.skipif(ptxas_path() is None, reason="triton has no bundled NVIDIA backend / ptxas")
def test_kernels_compile_for_sm90():
    proc = run_compiled(SCRIPT, timeout=600)
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
