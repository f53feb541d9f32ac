// A CPU emulator of the CUDA subset oscar_ray/kernels/int2_decode.cu uses, for CI (no GPU there).
//
// The kernel source is compiled unchanged by g++ with OSCAR_CPU_EMU defined, which swaps its block
// of inline-PTX primitives for the definitions below.  Each CUDA thread of a CTA is a ucontext
// coroutine; CTAs run one after another.  A scheduler resumes the CTA's threads round-robin, and
// every warp-collective operation (mma.sync, movmatrix, shuffles, vote, __syncwarp) deposits this
// lane's operands, yields, reads the other lanes' operands, and yields again.  The 32 lanes of a
// warp execute the same collectives in the same order (the kernel has no divergent collectives),
// so one round of the scheduler is one lock-step of the warp: when a lane reads, all 32 have
// deposited, and no lane overwrites its operands before all have read.  __syncthreads is released
// by the scheduler between rounds, so a warp's lanes also leave it in the same round.  A switch is
// ~6 register pushes on x86-64 (emu_switch below; glibc's swapcontext makes a sigprocmask system
// call per switch, ~10x slower: a CTA does ~8000 switches), ucontext elsewhere.
//
// The fragment maps are PTX ISA 8.x's: mma.m16n8k16 .bf16 and .f16 row.col, A a0..a3 = (row g, cols 2t..),
// (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..); B b0, b1 = (rows 2t, 2t + 1 | 2t + 8, 2t + 9,
// col g); C c0..c3 = (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1); movmatrix.trans: lane
// (g, t) gets row g, cols 2t, 2t + 1 of the 8x8 transpose.  cp.async copies land when the thread
// waits for their group (EMU_CP_EARLY=0, the latest legal time: a read before the wait sees stale
// bytes) or at issue (EMU_CP_EARLY=1, the earliest: a slot refilled while a lane still reads it
// shows).  Arithmetic: products exact, fp32 sums in k order, exp2f for ex2.approx (ftz), RNE bf16
// and fp16 (subnormals kept).
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#ifndef EMU_CP_EARLY
#define EMU_CP_EARLY 0
#endif

typedef unsigned int u32;
using std::min;
using std::max;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
// CTAs run one at a time: a static is the CTA's shared memory.  They live in a section of their own,
// which launch() fills with 0xFF bytes (NaN as fp32 and fp16) before every CTA, as a GPU leaves
// shared memory with whatever the previous CTA wrote: a read of a byte no one stored shows
#define __shared__ static __attribute__((section("emu_shared")))
#define __align__(n) __attribute__((aligned(n)))

struct float2 { float x, y; };
struct uint2 { u32 x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float __uint_as_float(u32 u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline u32 __float_as_uint(float f) { u32 u; std::memcpy(&u, &f, 4); return u; }

namespace emu {
struct Copy { void* dst; const void* src; int n; };
struct Bar { int count = 0, pending = 0; long long tx = 0; unsigned phase = 0; std::vector<Copy> inflight; };
inline std::map<const void*, Bar> bars;  // per CTA: launch() clears it with the shared memory
inline std::string error;  // the launch's first misuse of a primitive (the Python side raises it)
inline void fail(const char* what) { if (error.empty()) error = what; }
struct Idx { unsigned x, y, z; };
#if defined(__x86_64__)
// emu_switch(&save_sp, new_sp): push the callee-saved registers, swap stacks, pop, return there
extern "C" void emu_switch(void** save, void* next);
asm(R"(
.text
.globl emu_switch
.hidden emu_switch
.type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");
struct Context { void* sp = nullptr; };
#else
struct Context { ucontext_t uc; };
#endif

struct Thread {
    Context ctx;
    unsigned tid = 0;
    bool done = false;
    std::vector<Copy> open;                 // cp.async copies not yet committed
    std::vector<std::vector<Copy>> groups;  // committed groups, oldest first
};
struct WarpX { u32 op[32][6]; };  // one collective's operands, per lane

inline Thread* cur = nullptr;
inline Context sched;
inline std::vector<Thread> threads;
inline std::vector<std::vector<char>> stacks;
inline std::vector<WarpX> warps;
inline Idx block{0, 0, 0};
inline int bar_arrived = 0;
inline unsigned bar_gen = 0;
inline std::function<void()> entry;
extern "C" __attribute__((visibility("hidden"))) char __start_emu_shared[], __stop_emu_shared[];  // linker-made bounds
constexpr size_t STACK = 1 << 18;

#if defined(__x86_64__)
inline void switch_to(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
#else
inline void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif
inline void yield() { switch_to(cur->ctx, sched); }
inline int lane() { return cur->tid & 31; }
inline WarpX& wx() { return warps[cur->tid >> 5]; }
inline Idx tidx() { return {cur->tid, 0, 0}; }

// deposit this lane's operands, wait a round (all lanes deposited), f(reads), wait a round
template <class F> inline void collective(std::initializer_list<u32> ops, F&& f) {
    int i = 0;
    for (u32 v : ops) wx().op[lane()][i++] = v;
    yield();
    f(wx());
    yield();
}

[[noreturn]] inline void trampoline() {
    entry();
    cur->done = true;
    for (;;) yield();  // never resumed once done
}

inline void start(Thread& th, std::vector<char>& stack) {
#if defined(__x86_64__)
    // the frame emu_switch pops: r15 r14 r13 r12 rbx rbp, then the return address (16-byte aligned,
    // so trampoline is entered with rsp = 8 mod 16, as after a call)
    auto top = (reinterpret_cast<uintptr_t>(stack.data()) + stack.size() - 32) & ~uintptr_t(15);
    void** frame = reinterpret_cast<void**>(top) - 6;
    for (int i = 0; i < 6; ++i) frame[i] = nullptr;
    *reinterpret_cast<void**>(top) = reinterpret_cast<void*>(&trampoline);
    th.ctx.sp = frame;
#else
    getcontext(&th.ctx.uc);
    th.ctx.uc.uc_stack.ss_sp = stack.data();
    th.ctx.uc.uc_stack.ss_size = stack.size();
    th.ctx.uc.uc_link = nullptr;
    makecontext(&th.ctx.uc, reinterpret_cast<void (*)()>(&trampoline), 0);
#endif
}

// run `kernel` (a callable running one CUDA thread of the current CTA) over grid gx x gy x gz
inline void launch(int gx, int gy, int gz, int n_threads, std::function<void()> kernel) {
    threads.assign(n_threads, Thread());
    warps.assign((n_threads + 31) / 32, WarpX());
    stacks.resize(n_threads);
    for (auto& s : stacks) s.resize(STACK);
    entry = std::move(kernel);
    error.clear();
    for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
            for (int x = 0; x < gx; ++x) {
                block = {unsigned(x), unsigned(y), unsigned(z)};
                bar_arrived = 0;
                std::memset(__start_emu_shared, 0xff, size_t(__stop_emu_shared - __start_emu_shared));
                bars.clear();
                for (int t = 0; t < n_threads; ++t) {
                    Thread& th = threads[t];
                    th = Thread();
                    th.tid = t;
                    start(th, stacks[t]);
                }
                int live = n_threads;
                while (live) {
                    for (auto& th : threads) {
                        if (th.done) continue;
                        cur = &th;
                        switch_to(sched, th.ctx);
                        if (th.done) --live;
                    }
                    if (bar_arrived && bar_arrived == n_threads) { bar_arrived = 0; ++bar_gen; }
                }
            }
}

inline uint16_t bf16_rne(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_at(u32 w, int half) { return __uint_as_float(half ? (w & 0xffff0000u) : (w << 16)); }
inline float half_to_float(uint16_t h) {
    const u32 s = (h >> 15) & 1u, e = (h >> 10) & 31u, m = h & 1023u;
    float v;
    if (e == 0) v = std::ldexp(float(m), -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = __uint_as_float(((e + 112u) << 23) | (m << 13));
    return s ? -v : v;
}
inline uint16_t f16_rne(float f) {  // cvt.rn.f16: round to nearest even, subnormals kept, inf past 65504
    const uint16_t sign = uint16_t((__float_as_uint(f) >> 16) & 0x8000u);
    const float a = std::fabs(f);
    if (std::isnan(f)) return uint16_t(sign | 0x7e00u);
    if (a >= 65520.0f) return uint16_t(sign | 0x7c00u);
    if (a < 6.103515625e-05f) return uint16_t(sign | uint16_t(std::nearbyint(a * 16777216.0f)));  // 2^-24 units
    const u32 x = __float_as_uint(a);
    return uint16_t(sign | uint16_t(((x + 0xfffu + ((x >> 13) & 1u)) >> 13) - (112u << 10)));
}
inline float f16_at(u32 w, int half) { return half_to_float(uint16_t(half ? w >> 16 : w & 0xffffu)); }
inline void copy_group(const std::vector<Copy>& g) {
    for (const Copy& c : g) std::memcpy(c.dst, c.src, c.n);
}
inline void cp(void* dst, const void* src, bool on, int n) {
    if (!on) return;
    if (EMU_CP_EARLY) std::memcpy(dst, src, n);
    else cur->open.push_back({dst, src, n});
}
}  // namespace emu

#define threadIdx (emu::tidx())
#define blockIdx (emu::block)

inline void __syncthreads() {
    const unsigned gen = emu::bar_gen;
    ++emu::bar_arrived;
    do emu::yield(); while (emu::bar_gen == gen);
}
inline void __syncwarp(u32 = 0xffffffffu) { emu::yield(); }
template <class T> inline T __shfl_sync(u32, T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    u32 bits, out = 0;
    std::memcpy(&bits, &v, 4);
    emu::collective({bits}, [&](emu::WarpX& x) { out = x.op[src & 31][0]; });
    T r;
    std::memcpy(&r, &out, 4);
    return r;
}
template <class T> inline T __shfl_xor_sync(u32 mask, T v, int m) {
    // the source lane depends on the reader: read after the deposit round, as __shfl_sync does
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    u32 bits, out = 0;
    std::memcpy(&bits, &v, 4);
    const int src = emu::lane() ^ m;
    emu::collective({bits}, [&](emu::WarpX& x) { out = x.op[src & 31][0]; });
    (void)mask;
    T r;
    std::memcpy(&r, &out, 4);
    return r;
}
inline int __any_sync(u32, int pred) {
    int any = 0;
    emu::collective({u32(pred != 0)}, [&](emu::WarpX& x) { for (int l = 0; l < 32; ++l) any |= int(x.op[l][0]); });
    return any;
}

// --- the primitives of int2_decode.cu's OSCAR_CPU_EMU block ---------------------------------------
template <u32 M> inline u32 lopm(u32 x) { return (x & M) | 0x43004300u; }  // lop3 0xEA: (a & b) | c
template <u32 M> inline u32 lopm16(u32 x) { return (x & M) | 0x64006400u; }
inline u32 prmt(u32 a, u32 b, u32 sel) {
    unsigned char bytes[8];
    std::memcpy(bytes, &a, 4);
    std::memcpy(bytes + 4, &b, 4);
    u32 r = 0;
    for (int i = 0; i < 4; ++i) {
        const u32 s = (sel >> (4 * i)) & 15u;
        u32 byte = bytes[s & 7u];
        if (s & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;  // sign-replicate mode
        r |= byte << (8 * i);
    }
    return r;
}
inline u32 pack_bf16(float lo, float hi) { return u32(emu::bf16_rne(lo)) | (u32(emu::bf16_rne(hi)) << 16); }
inline u32 pack_f16(float lo, float hi) { return u32(emu::f16_rne(lo)) | (u32(emu::f16_rne(hi)) << 16); }
inline u32 trans8(u32 x) {
    u32 r = 0;
    emu::collective({x}, [&](emu::WarpX& w) {
        const int g = emu::lane() >> 2, t = emu::lane() & 3;
        for (int h = 0; h < 2; ++h) {  // element (g, 2t + h) of M^T = M[2t + h][g]
            const int row = 2 * t + h;
            const u32 src = w.op[row * 4 + (g >> 1)][0];
            const u32 v = (g & 1) ? (src >> 16) : (src & 0xffffu);
            r |= v << (16 * h);
        }
    });
    return r;
}
template <float (*AT)(u32, int)>
inline void mma_any(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    emu::collective({a0, a1, a2, a3, b0, b1}, [&](emu::WarpX& w) {
        const int g = emu::lane() >> 2, t = emu::lane() & 3;
        auto A = [&](int r, int k) { return AT(w.op[(r & 7) * 4 + ((k & 7) >> 1)][(r >= 8) + 2 * (k >= 8)], k & 1); };
        auto B = [&](int k, int n) { return AT(w.op[n * 4 + ((k & 7) >> 1)][4 + (k >= 8)], k & 1); };
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            float s = 0.0f;
            for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
            c[i] += s;
        }
    });
}
inline void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { mma_any<emu::bf16_at>(c, a0, a1, a2, a3, b0, b1); }
inline void mma16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { mma_any<emu::f16_at>(c, a0, a1, a2, a3, b0, b1); }
inline float ex2(float x) {
    const float r = std::exp2(x);
    return std::fabs(r) < FLT_MIN ? 0.0f : r;  // .ftz
}
inline void cp16(void* dst, const void* src, bool on) { emu::cp(dst, src, on, 16); }
inline void cp4(void* dst, const void* src, bool on) { emu::cp(dst, src, on, 4); }
inline float2 halves(u32 x) { return {emu::half_to_float(uint16_t(x & 0xffffu)), emu::half_to_float(uint16_t(x >> 16))}; }
inline void cp_commit() {
    emu::cur->groups.push_back(std::move(emu::cur->open));
    emu::cur->open.clear();
}
template <int N> inline void cp_wait() {  // all but the newest N committed groups complete
    auto& gs = emu::cur->groups;
    while (int(gs.size()) > N) {
        emu::copy_group(gs.front());
        gs.erase(gs.begin());
    }
}
// mbarrier + cp.async.bulk: a barrier's phase completes when its pending arrivals and its tx bytes
// are both zero (tx may dip below zero when bytes land before the arrive.expect_tx).  Bulk copies
// land at the first wait on their barrier (EMU_CP_EARLY=0) or at issue (1), as cp.async's do.
typedef unsigned long long bar_t;
namespace emu {
inline Bar& bar_of(const bar_t* b) {
    auto it = bars.find(b);
    if (it == bars.end()) { fail("mbarrier used before mbarrier.init"); return bars[b]; }
    return it->second;
}
inline void bar_settle(Bar& b) {
    if (b.pending == 0 && b.tx == 0) { ++b.phase; b.pending = b.count; }
}
}  // namespace emu
inline void bar_init(bar_t* bar, int count) { emu::bars[bar] = emu::Bar{count, count, 0, 0, {}}; }
inline void bar_init_fence() {}
inline void bar_expect(bar_t* bar, u32 bytes) {
    emu::Bar& b = emu::bar_of(bar);
    if (b.pending <= 0) { emu::fail("mbarrier arrival past its count"); return; }
    b.tx += bytes;
    --b.pending;
    emu::bar_settle(b);
}
inline void bulk(void* dst, const void* src, u32 bytes, bar_t* bar) {
    if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
        emu::fail("cp.async.bulk needs 16-byte sizes and addresses");
    emu::Bar& b = emu::bar_of(bar);
    if (EMU_CP_EARLY) { std::memcpy(dst, src, bytes); b.tx -= bytes; emu::bar_settle(b); }
    else b.inflight.push_back({dst, src, int(bytes)});
}
inline void bar_wait(bar_t* bar, u32 parity) {
    // a warp's lanes wait together (one collective round: each has issued what precedes its wait),
    // then copies land one at a time only until the phase completes, so an arrive.expect_tx that
    // counts too few bytes leaves the rest unlanded (stale slot bytes) or, past zero, never
    // completes, as too many do
    emu::collective({0u}, [](emu::WarpX&) {});
    emu::Bar& b = emu::bar_of(bar);
    size_t k = 0;
    for (; (b.phase & 1u) == (parity & 1u) && k < b.inflight.size(); ++k) {
        std::memcpy(b.inflight[k].dst, b.inflight[k].src, b.inflight[k].n);
        b.tx -= b.inflight[k].n;
        emu::bar_settle(b);
    }
    b.inflight.erase(b.inflight.begin(), b.inflight.begin() + k);
    emu::bar_settle(b);
    if ((b.phase & 1u) == (parity & 1u)) emu::fail("mbarrier wait never completes (expect_tx does not match the bytes that land)");
}
