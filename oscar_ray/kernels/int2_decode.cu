// INT2-tier decode partials (oscar_ray/kernels/decode_cuda.py builds and launches this file).
// __NAME__ placeholders are replaced per specialisation by decode_cuda.kernel_source(), which also pastes
// int2_primitives.cu (the PTX primitives, the code unpack, the tile load) at the marker line below the defines
// and int2_ring.cu (the cp.async ring's loop) at its marker inside the kernel (a line of its own, after the
// step lambdas); the fragment maps and the algebra are described in decode_cuda.py's module docstring.
typedef unsigned int u32;
#define NT __NT__
#define G __G__
#define PAGE __PAGE__
#define WARPS __WARPS__
#define MINB __MINB__
#define SHIFTLESS __SHIFTLESS__
#define C_TOK __C_TOK__
#define PIPE __PIPE__
#define HALF_ROWS __HALF_ROWS__
#define READ_ONLY __READ_ONLY__  // benchmarks' copy ceiling: the ring's copies and waits, no attention
#define BULK __BULK__  // ring refills by cp.async.bulk, one per page run (head-major pages, sm_90)
#define LOOKAHEAD __LOOKAHEAD__  // ring: step i + 1's scores beside step i's P'·V (the ring loop)
#define LA (LOOKAHEAD && PIPE && !READ_ONLY)
#define PAGE_AHEAD __PAGE_AHEAD__  // ring: steps between a refill's page-id load and its copies (1, 2)
#define KCHAINS __KCHAINS__  // 1 or 2 dependent MMA chains per tile for the scores (int2_decode.cu: scores)
#define STEP_BYTES __STEP_BYTES__
#define S_TOK __S_TOK__
#define D 128
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define RESCALE_SLACK 8.0f  // log2 units: the reference max moves when a score is 2^8 above it

__PRIMITIVES__

extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)
oscar_int2_decode_d128(const float* __restrict__ q, const unsigned char* __restrict__ kc,
        const unsigned short* __restrict__ ks, const unsigned char* __restrict__ vc,
        const unsigned short* __restrict__ vs, const int* __restrict__ table, const int* __restrict__ lens,
        float* __restrict__ mid_o, float* __restrict__ mid_lse, double qk_scale_d, int sqb, int sqh,
        int c_page, int c_head, int s_page, int s_head, int s_table, int n_q_heads,
        int total_splits, int n_splits) {
#if PIPE
    // per warp a ring of PIPE steps: K codes, V codes [32 tokens][32 B], K / V (s, z) [32]; the
    // epilogue's sh_o reuses the same bytes once every warp has left its loop.  READ_ONLY: padded so
    // the ceiling runs at the kernel's residency (MINB CTAs per SM, what its registers allow) and not
    // at the ~6 its few registers would: MINB + 1 CTAs of this size (+1 KB reserved each) overflow
    // Hopper's 228 KB per SM (capped by the 48 KB of static shared memory: exact for MINB >= 4)
    constexpr int RING = WARPS * PIPE * STEP_BYTES > WARPS * 8 * NT * D * 4 ? WARPS * PIPE * STEP_BYTES
                                                                             : WARPS * 8 * NT * D * 4;
    constexpr int PAD_FIT = 228 * 1024 / (MINB + 1) - 1024 + 64;
    constexpr int PAD = !READ_ONLY ? 0 : PAD_FIT < 47 * 1024 ? PAD_FIT : 47 * 1024;
    __shared__ __align__(16) unsigned char sh_raw[RING > PAD ? RING : PAD];
    float (*sh_o)[8 * NT][D] = reinterpret_cast<float (*)[8 * NT][D]>(sh_raw);
#if BULK
    __shared__ bar_t sh_bar[WARPS][PIPE];  // slot j of warp w is full when phase k of its barrier completes
#endif
#else
    __shared__ float sh_o[WARPS][8 * NT][D];
#endif
    __shared__ float sh_m[WARPS][8 * NT], sh_l[WARPS][8 * NT];
    const int b = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const float qk_scale = (float)qk_scale_d;
    const int seq_len = lens[b];
    const int split_len = ((seq_len + n_splits - 1) / n_splits + 31) / 32 * 32;
    const int start = split * split_len;
    const int end = min(start + split_len, seq_len);
    const int* trow = table + (long long)b * s_table;
    const unsigned char* kq = kc + (long long)kh * c_head + g * C_TOK + 8 * t;
    const unsigned char* vq = vc + (long long)kh * c_head + 2 * t * C_TOK + 4 * g;
    const unsigned short* ksq = ks + (long long)kh * s_head + g * S_TOK;
    const unsigned short* vsq = vs + (long long)kh * s_head + g * S_TOK;

    // q^T fragments (B operand) in the K permutation, pre-scaled and rounded (bf16, fp16 when KF16) once
    // qsum2: Σ of the fragments' values (q / the code's factor), whose K_OFFSET·qsum2 is the offset
    // the MMA adds; qsum: Σ of fragment × factor, the q the MMA's c-term sees (exact powers of two)
    u32 qf[NT][8][2];
    float qsum[NT][2], qsum2[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int h = nt * 8 + g;
        const float* qrow = q + (long long)b * sqb + (long long)(kh * G + (h < G ? h : 0)) * sqh;
        const float on = h < G ? qk_scale : 0.0f;
        float part = 0.0f, part2 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int base = 8 * t + 4 * (j >> 2) + 32 * (j & 3);
            const float f0 = kscale(0, j & 3), f1 = kscale(1, j & 3);  // b0 pairs with bytes 0, 2; b1 with 1, 3
            const float2 r0 = kunpack(kpack(qrow[base] * on, qrow[base + 2] * on));
            const float2 r1 = kunpack(kpack(qrow[base + 1] * on, qrow[base + 3] * on));
            qf[nt][j][0] = kpack(r0.x * f0, r0.y * f0);
            qf[nt][j][1] = kpack(r1.x * f1, r1.y * f1);
            const float2 e0 = kunpack(qf[nt][j][0]), e1 = kunpack(qf[nt][j][1]);
            part2 += (e0.x + e0.y) + (e1.x + e1.y);
            part += (e0.x + e0.y) / f0 + (e1.x + e1.y) / f1;
        }
        part += __shfl_xor_sync(FULL, part, 1);
        part += __shfl_xor_sync(FULL, part, 2);  // Σq of head 8nt + g, in every lane of group g
        part2 += __shfl_xor_sync(FULL, part2, 1);
        part2 += __shfl_xor_sync(FULL, part2, 2);
        qsum[nt][0] = __shfl_sync(FULL, part, 8 * t);      // head 8nt + 2t
        qsum[nt][1] = __shfl_sync(FULL, part, 8 * t + 4);  // head 8nt + 2t + 1
        qsum2[nt][0] = __shfl_sync(FULL, part2, 8 * t);
        qsum2[nt][1] = __shfl_sync(FULL, part2, 8 * t + 4);
    }

    float acc[8][NT][4];
    float m[NT][2], mr[NT][2], qoff[NT][2], l[NT][2], lr[NT][2], zs[NT][2];  // lr = Σ P' (rounded), zs = Σ P'·z_V
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.0f;
        m[nt][0] = m[nt][1] = NEG_INF;
        mr[nt][0] = mr[nt][1] = 0.0f;
        qoff[nt][0] = K_OFFSET * qsum2[nt][0];  // the MMA's offset of the +K_OFFSET codes
        qoff[nt][1] = K_OFFSET * qsum2[nt][1];
        l[nt][0] = l[nt][1] = lr[nt][0] = lr[nt][1] = zs[nt][0] = zs[nt][1] = 0.0f;
    }

    // one 32-token step (two tiles) of this warp: scores, online softmax, P'·V, as three parts so
    // that LOOKAHEAD can put step i + 1's scores beside step i's P'·V (see the ring loop)
    // tail (a literal at each call, so each inlined copy folds it): true only for a step reaching
    // past end; a full step, every step but a warp's last, skips the token masks (4 ISETP + 16 FSEL)
    struct Scores {
        float s[2][NT][4];           // u = score − mr of S^T[token, head], both tiles (log2 units)
        float vsc[2][2], vzc[2][2];  // V (s, z) of tokens g, g + 8, 0 when masked
    };
    auto scores = [&](const Tile (&T)[2], const int n0, const bool tail, Scores& S) {
        float (&s)[2][NT][4] = S.s;
        float (&vsc)[2][2] = S.vsc;
        float (&vzc)[2][2] = S.vzc;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            // KCHAINS 2: the 8 k-steps of a tile accumulate into two registers sets (words w = 0, 1),
            // summed after: two dependent chains of 4 MMAs instead of one of 8 (MMA latency ~30 cycles)
            float s2[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
                s2[nt][0] = s2[nt][1] = s2[nt][2] = s2[nt][3] = 0.0f;
            }
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                const u32 wl = w ? T[mt].k_lo.y : T[mt].k_lo.x;
                const u32 wh = w ? T[mt].k_hi.y : T[mt].k_hi.x;
                const u32 yl = KF16 ? wl >> 10 : 0u, yh = KF16 ? wh >> 10 : 0u;
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const u32 a0 = kcode(wl, yl, 0, kk), a2 = kcode(wl, yl, 1, kk);
                    const u32 a1 = kcode(wh, yh, 0, kk), a3 = kcode(wh, yh, 1, kk);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        KMMA(KCHAINS == 2 && w ? s2[nt] : s[mt][nt], a0, a1, a2, a3, qf[nt][4 * w + kk][0], qf[nt][4 * w + kk][1]);
                }
            }
#if KCHAINS == 2
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                for (int c = 0; c < 4; ++c) s[mt][nt][c] += s2[nt][c];
#endif
            const int tok = n0 + 16 * mt + g;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const bool ok = !tail || tok + 8 * r < end;
                const float2 kz = halves(T[mt].ksz[r]);
                const float2 vz = halves(T[mt].vsz[r]);
                vsc[mt][r] = ok ? vz.x : 0.0f;
                vzc[mt][r] = ok ? vz.y : 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        // u = score - mr, log2 units: the reference folded into the fixup's FFMA
                        const float e = fmaf(kz.y, qsum[nt][hh], qoff[nt][hh]);
                        const float u = fmaf(kz.x, s[mt][nt][2 * r + hh] - e, -mr[nt][hh]);
                        s[mt][nt][2 * r + hh] = ok ? u : NEG_INF;
                    }
                }
            }
        }
    };
    auto rescale = [&](Scores& S) {
        float (&s)[2][NT][4] = S.s;
        // online softmax with a lazy reference: p = 2^(score - m) against the running reference m, which
        // moves only when a score exceeds it by more than RESCALE_SLACK (p <= 2^8: exact in fp32 / bf16
        // range, l and acc stay consistent with m; the merge only needs (m, l, acc) to agree).  The
        // common step then needs no cross-lane max (3 dependent SHFL + FMNMX per head column) and no
        // alpha ex2: each lane compares its own 4 scores per column, one vote decides for the warp.
        // s holds u = score - mr (mr = m, or 0 while m is -inf: no score seen yet, which also moves m).
        float lm[NT][2];
        bool big = false;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                lm[nt][hh] = fmaxf(fmaxf(s[0][nt][hh], s[0][nt][2 + hh]), fmaxf(s[1][nt][hh], s[1][nt][2 + hh]));
                big |= lm[nt][hh] > RESCALE_SLACK || m[nt][hh] == NEG_INF;
            }
        }
        if (__any_sync(FULL, big)) {  // the first step, and the rare step whose scores outgrow m by 2^8
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    float x = lm[nt][hh];
                    x = fmaxf(x, __shfl_xor_sync(FULL, x, 4));
                    x = fmaxf(x, __shfl_xor_sync(FULL, x, 8));
                    x = fmaxf(x, __shfl_xor_sync(FULL, x, 16));
                    const float mn = fmaxf(m[nt][hh], x + mr[nt][hh]);
                    const float alpha = (mn == NEG_INF) ? 1.0f : ex2(m[nt][hh] - mn);
                    const float mr_new = (mn == NEG_INF) ? 0.0f : mn;
                    const float shift = mr_new - mr[nt][hh];  // re-base this step's u on the new reference
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) { s[mt][nt][hh] -= shift; s[mt][nt][2 + hh] -= shift; }
                    m[nt][hh] = mn;
                    mr[nt][hh] = mr_new;
                    l[nt][hh] *= alpha; lr[nt][hh] *= alpha; zs[nt][hh] *= alpha;
#pragma unroll
                    for (int i = 0; i < 8; ++i) { acc[i][nt][hh] *= alpha; acc[i][nt][2 + hh] *= alpha; }
                }
            }
        }
    };
    // vslot (PIPE): the step's ring slot, from which each tile's V code words are read right before
    // its P'·V MMAs, so they are not live across the scores (the register path keeps them in T)
    auto pv = [&](const Scores& S, const Tile (&T)[2], const unsigned char* vslot) {
        const float (&s)[2][NT][4] = S.s;
        const float (&vsc)[2][2] = S.vsc;
        const float (&vzc)[2][2] = S.vzc;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            u32 b0[NT], b1[NT];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                float ps[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int hh = c & 1, r = c >> 1;
                    const float p = ex2(s[mt][nt][c]);
                    l[nt][hh] += p;
                    ps[c] = p * vsc[mt][r];
                }
                const u32 lo = pack_bf16(ps[0], ps[1]), hi = pack_bf16(ps[2], ps[3]);
                // the offsets with the rounded P' the MMA sees: Σ P' (for the 128) and Σ P'·z
                lr[nt][0] += bf16_lo(lo) + bf16_lo(hi);
                lr[nt][1] += bf16_hi(lo) + bf16_hi(hi);
                zs[nt][0] += bf16_lo(lo) * vzc[mt][0] + bf16_lo(hi) * vzc[mt][1];
                zs[nt][1] += bf16_hi(lo) * vzc[mt][0] + bf16_hi(hi) * vzc[mt][1];
                b0[nt] = trans8(lo);  // P'^T rows (tokens 2t, 2t + 1), column head g
                b1[nt] = trans8(hi);  // tokens 2t + 8, 2t + 9
            }
            u32 v[4];
#if PIPE
            const unsigned char* vr0 = vslot + 1024 + (16 * mt + 2 * t) * 32 + 4 * g;
            v[0] = *(const u32*)(vr0);
            v[1] = *(const u32*)(vr0 + 32);
            v[2] = *(const u32*)(vr0 + 8 * 32);
            v[3] = *(const u32*)(vr0 + 9 * 32);
#else
            v[0] = T[mt].v[0], v[1] = T[mt].v[1], v[2] = T[mt].v[2], v[3] = T[mt].v[3];
#endif
            const u32 xl = prmt(v[0], v[1], 0x5410), yl = prmt(v[0], v[1], 0x7632);
            const u32 xh = prmt(v[2], v[3], 0x5410), yh = prmt(v[2], v[3], 0x7632);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const u32 a0 = code(xl, kk), a1 = code(xl >> 8, kk), a2 = code(xh, kk), a3 = code(xh >> 8, kk);
                const u32 e0 = code(yl, kk), e1 = code(yl >> 8, kk), e2 = code(yh, kk), e3 = code(yh >> 8, kk);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    mma(acc[2 * kk][nt], a0, a1, a2, a3, b0[nt], b1[nt]);
                    mma(acc[2 * kk + 1][nt], e0, e1, e2, e3, b0[nt], b1[nt]);
                }
            }
        }
    };
    auto process = [&](const Tile (&T)[2], const int n0, const unsigned char* vslot, const bool tail) {
        Scores S;
        scores(T, n0, tail, S);
        rescale(S);
        pv(S, T, vslot);
    };
    auto step = [&](const Tile (&T)[2], const int n0, const unsigned char* vslot) {  // the tail dispatch
        if (n0 + 32 <= end) process(T, n0, vslot, false);
        else process(T, n0, vslot, true);
    };
    auto load_step = [&](Tile (&T)[2], const int n) {
        load_tile(T[0], n, end, trow, kq, ksq, vq, vsq, c_page, s_page);
        if (n + 16 < end) load_tile(T[1], n + 16, end, trow, kq, ksq, vq, vsq, c_page, s_page);
        else T[1] = T[0];  // masked: all its tokens are >= end
    };
    const int stride = WARPS * 32;
#if PIPE
__RING__
    __syncthreads();  // sh_o aliases the rings
#else
    // two register buffers in ping-pong: the next step's bytes are in flight while this one computes
    Tile ta[2], tb[2];
    if (start + warp * 32 < end) load_step(ta, start + warp * 32);
    for (int n0 = start + warp * 32; n0 < end; n0 += 2 * stride) {
        const int n1 = n0 + stride;
        if (n1 < end) load_step(tb, n1);
        step(ta, n0, nullptr);
        if (n1 >= end) break;
        if (n1 + stride < end) load_step(ta, n1 + stride);
        step(tb, n1, nullptr);
    }
#endif

    // per-warp state -> shared memory: l, lr, zs summed over the 8 token rows (lanes g)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) {
                l[nt][hh] += __shfl_xor_sync(FULL, l[nt][hh], off);
                lr[nt][hh] += __shfl_xor_sync(FULL, lr[nt][hh], off);
                zs[nt][hh] += __shfl_xor_sync(FULL, zs[nt][hh], off);
            }
            const int h = nt * 8 + 2 * t + hh;
            if (g == 0) { sh_m[warp][h] = m[nt][hh]; sh_l[warp][h] = l[nt][hh]; }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int d = 4 * g + 2 * (i & 1) + 32 * (i >> 1);
            const float f = code_scale(i >> 1);  // d-tile i holds code i >> 1 of its bytes, times 4^(i >> 1)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int hh = c & 1, r = c >> 1;  // Σ P'(c − z) = (acc − 128 Σ P') / 4^kk − Σ P' z
                sh_o[warp][nt * 8 + 2 * t + hh][d + r] = (acc[i][nt][c] - 128.0f * lr[nt][hh]) * f - zs[nt][hh];
            }
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * D; e += WARPS * 32) {
        const int h = e / D, d = e % D;
        float top = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) top = fmaxf(top, sh_m[w][h]);
        float o = 0.0f, tot = 0.0f;
        if (top != NEG_INF) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float wt = ex2(sh_m[w][h] - top);
                o += wt * sh_o[w][h][d];
                tot += wt * sh_l[w][h];
            }
        }
        const long long row = ((long long)b * n_q_heads + kh * G + h) * total_splits + split;
        mid_o[row * D + d] = tot > 0.0f ? o / tot : 0.0f;
        if (d == 0) mid_lse[row] = tot > 0.0f ? top + log2f(tot) : NEG_INF;
    }
}
