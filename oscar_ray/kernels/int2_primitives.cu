// The PTX primitives, the code unpack and the register path's tile load of int2_decode.cu
// (decode_cuda.kernel_source() pastes this file where int2_decode.cu says __PRIMITIVES__, after the
// __NAME__ defines it uses).

// The PTX primitives.  tests/unit/kernels/cuda_emu.h defines the same functions for a CPU build of
// this file (OSCAR_CPU_EMU), which runs the kernel lane by lane in CI; everything below the block
// is compiled unchanged on both.
#ifndef OSCAR_CPU_EMU
template <u32 M> __device__ __forceinline__ u32 lopm(u32 x) {  // (x & M) | bf16(128) in both lanes
    u32 r; asm("lop3.b32 %0, %1, %2, 0x43004300, 0xEA;" : "=r"(r) : "r"(x), "n"(M)); return r;
}
template <u32 M> __device__ __forceinline__ u32 lopm16(u32 x) {  // (x & M) | fp16(1024) in both lanes
    u32 r; asm("lop3.b32 %0, %1, %2, 0x64006400, 0xEA;" : "=r"(r) : "r"(x), "n"(M)); return r;
}
__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
    u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ void mma16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel)); return r;
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ u32 trans8(u32 x) {
    u32 r; asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x)); return r;
}
__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float ex2(float x) {
    float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
__device__ __forceinline__ void cp16(void* dst, const void* src, bool on) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("{.reg .pred p; setp.ne.b32 p, %2, 0; @p cp.async.cg.shared.global [%0], [%1], 16;}"
                 :: "r"(d), "l"(src), "r"((int)on));
}
__device__ __forceinline__ void cp4(void* dst, const void* src, bool on) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("{.reg .pred p; setp.ne.b32 p, %2, 0; @p cp.async.ca.shared.global [%0], [%1], 4;}"
                 :: "r"(d), "l"(src), "r"((int)on));
}
__device__ __forceinline__ float2 halves(u32 x) {  // fp16 (s, z) pair -> floats
    float a, b;
    asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}" : "=f"(a), "=f"(b) : "r"(x));
    return make_float2(a, b);
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
// BULK (sm_90): one cp.async.bulk per contiguous run, completing on the slot's mbarrier (tx bytes)
typedef unsigned long long bar_t;
__device__ __forceinline__ void bar_init(bar_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((u32)__cvta_generic_to_shared(bar)), "r"(count));
}
__device__ __forceinline__ void bar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void bar_expect(bar_t* bar, u32 bytes) {  // this thread's arrival + the phase's bytes
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"((u32)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(bar_t* bar, u32 parity) {  // until the phase of this parity completed
    asm volatile("{.reg .pred p; WAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra WAIT_%=;}"
                 :: "r"((u32)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, u32 bytes, bar_t* bar) {
    // the generic-proxy reads of the slot's last use are ordered before this async-proxy write
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes),
                    "r"((u32)__cvta_generic_to_shared(bar)) : "memory");
}
#endif  // OSCAR_CPU_EMU
__device__ __forceinline__ float bf16_lo(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }
// code kk (bits 2kk, 2kk + 1) of the bytes in lanes 0 and 2 of x, as two bf16.  SHIFTLESS: masks in
// place for kk = 0..2 give 128 + 4^kk·c (exact: <= 176, bf16 ulp 1 below 256), so 3 shifts per word
// instead of 7; the 4^kk is divided out of q (keys) and of the output rows (values).  kk = 3 would
// reach the exponent bit and is shifted down.
__device__ __forceinline__ u32 code(u32 x, int kk) {
#if SHIFTLESS
    if (kk == 0) return lopm<0x00030003u>(x);
    if (kk == 1) return lopm<0x000C000Cu>(x);
    if (kk == 2) return lopm<0x00300030u>(x);
    return lopm<0x00030003u>(x >> 6);
#else
    return lopm<0x00030003u>(x >> (2 * kk));
#endif
}
__device__ __forceinline__ float code_scale(int kk) {  // 1 / 4^kk of code(): what q and o rows carry
#if SHIFTLESS
    return kk == 1 ? 0.25f : (kk == 2 ? 0.0625f : 1.0f);
#else
    return 1.0f;
#endif
}
// Key codes.  KF16 (SHIFTLESS 2): the K side's MMAs take fp16, whose 10 mantissa bits hold a half's
// byte 0 and the low code of byte 1 in place: (x & 3·4^k) | fp16(1024) = 1024 + 4^k·c (exact, <= 1792),
// and y = x >> 10 brings byte 1's codes 1..3 down, so 1 shift per code word instead of 3 (16 SHF of a
// step's ~440 instructions).  Values keep the bf16 path (the +1024 would sit in acc across a split's
// tokens; per score it is a fresh 128-term sum).  kcode(x, y, bs, kk): code kk of bytes 0, 2 (bs 0) or
// 1, 3 (bs 1) of x; kscale: 1 / the factor it carries, applied to q.
#define KF16 (SHIFTLESS == 2)
__device__ __forceinline__ u32 kcode(u32 x, u32 y, int bs, int kk) {
#if KF16
    if (bs == 0) {
        if (kk == 0) return lopm16<0x00030003u>(x);
        if (kk == 1) return lopm16<0x000C000Cu>(x);
        if (kk == 2) return lopm16<0x00300030u>(x);
        return lopm16<0x00C000C0u>(x);
    }
    if (kk == 0) return lopm16<0x03000300u>(x);
    if (kk == 1) return lopm16<0x00030003u>(y);
    if (kk == 2) return lopm16<0x000C000Cu>(y);
    return lopm16<0x00300030u>(y);
#else
    return code(bs ? x >> 8 : x, kk);
#endif
}
__device__ __forceinline__ float kscale(int bs, int kk) {
#if KF16
    if (bs == 0) return kk == 0 ? 1.0f : (kk == 1 ? 0.25f : (kk == 2 ? 0.0625f : 0.015625f));
    return kk == 0 ? 0.00390625f : (kk == 1 ? 1.0f : (kk == 2 ? 0.25f : 0.0625f));
#else
    return code_scale(kk);
#endif
}
#if KF16
#define K_OFFSET 1024.0f
__device__ __forceinline__ u32 kpack(float lo, float hi) { return pack_f16(lo, hi); }
__device__ __forceinline__ float2 kunpack(u32 x) { return halves(x); }
#define KMMA mma16
#else
#define K_OFFSET 128.0f
__device__ __forceinline__ u32 kpack(float lo, float hi) { return pack_bf16(lo, hi); }
__device__ __forceinline__ float2 kunpack(u32 x) { return make_float2(bf16_lo(x), bf16_hi(x)); }
#define KMMA mma
#endif

struct Tile {  // one 16-token tile's bytes as this thread's fragments need them
    uint2 k_lo, k_hi;  // K codes of tokens g, g + 8: bytes 8t .. 8t + 7
    u32 v[4];          // V codes of tokens 2t, 2t + 1, 2t + 8, 2t + 9: bytes 4g .. 4g + 3
    u32 ksz[2], vsz[2];  // (s, z) fp16 of tokens g, g + 8
};

// kq / vq / ksq / vsq: this thread's first byte / element in page 0 (K codes of token g at byte 8t,
// V codes of token 2t at byte 4g, (s, z) of token g), so a load is one IMAD.WIDE per page and
// tensor plus an immediate offset (C_TOK / S_TOK are compile-time): 8 per tile instead of ~35
__device__ __forceinline__ void load_tile(Tile& T, int n, int end, const int* __restrict__ trow,
        const unsigned char* __restrict__ kq, const unsigned short* __restrict__ ksq,
        const unsigned char* __restrict__ vq, const unsigned short* __restrict__ vsq, int c_page, int s_page) {
    // n % 16 == 0 and PAGE >= 8: tokens n .. n + 7 share a page, and so do n + 8 .. n + 15
    const int p_lo = trow[n / PAGE];
    const int p_hi = (PAGE >= 16 || n + 8 >= end) ? p_lo : trow[(n + 8) / PAGE];
    const int o_lo = PAGE <= 16 ? 0 : n % PAGE;  // PAGE 8 / 16: n is a page (half-page) start
    const int o_hi = PAGE >= 16 ? 8 : 0;
    const unsigned char* kl = kq + (long long)p_lo * c_page + o_lo * C_TOK;
    const unsigned char* kh_ = kq + (long long)p_hi * c_page + o_lo * C_TOK;
    const unsigned char* vl = vq + (long long)p_lo * c_page + o_lo * C_TOK;
    const unsigned char* vh = vq + (long long)p_hi * c_page + o_lo * C_TOK;
    const unsigned short* ksl = ksq + (long long)p_lo * s_page + o_lo * S_TOK;
    const unsigned short* ksh = ksq + (long long)p_hi * s_page + o_lo * S_TOK;
    const unsigned short* vsl = vsq + (long long)p_lo * s_page + o_lo * S_TOK;
    const unsigned short* vsh = vsq + (long long)p_hi * s_page + o_lo * S_TOK;
    T.k_lo = *(const uint2*)(kl);
    T.k_hi = *(const uint2*)(kh_ + o_hi * C_TOK);
    T.v[0] = *(const u32*)(vl);
    T.v[1] = *(const u32*)(vl + C_TOK);
    T.v[2] = *(const u32*)(vh + o_hi * C_TOK);
    T.v[3] = *(const u32*)(vh + (o_hi + 1) * C_TOK);
    T.ksz[0] = *(const u32*)(ksl);
    T.ksz[1] = *(const u32*)(ksh + o_hi * S_TOK);
    T.vsz[0] = *(const u32*)(vsl);
    T.vsz[1] = *(const u32*)(vsh + o_hi * S_TOK);
}
