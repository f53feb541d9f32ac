// g++ entry point for the emulated INT2-tier decode kernel: KERNEL_SOURCE is a specialised
// int2_decode.cu (decode_cuda.kernel_source), compiled with -DOSCAR_CPU_EMU after cuda_emu.h.
#include "cuda_emu.h"
#include KERNEL_SOURCE

// ptrs: q, k codes, k scales, v codes, v scales, table, lens, mid_o, mid_lse (the launcher's order);
// ints: sqb, sqh, c_page, c_head, s_page, s_head, s_table, n_q_heads, total_splits, n_splits
extern "C" __attribute__((visibility("default"))) void emu_int2_decode(int gx, int gy, int gz, int n_threads, void** p, double qk_scale, const int* i) {
    emu::launch(gx, gy, gz, n_threads, [=] {
        oscar_int2_decode_d128((const float*)p[0], (const unsigned char*)p[1], (const unsigned short*)p[2],
                               (const unsigned char*)p[3], (const unsigned short*)p[4], (const int*)p[5],
                               (const int*)p[6], (float*)p[7], (float*)p[8], qk_scale, i[0], i[1], i[2], i[3],
                               i[4], i[5], i[6], i[7], i[8], i[9]);
    });
}

// the launch's first primitive misuse ("" when none): a wait that never completes, a bad bulk copy
extern "C" __attribute__((visibility("default"))) const char* emu_error() { return emu::error.c_str(); }
