/* Every compiled loop of the NumPy backend in one library (see ../compiled.py and ../direct.py). setup.py builds
 * it once per instruction set (kernels_<isa>.c include this file; XCONV_ISA names the build) and the loader
 * picks the best one the CPU runs, asking the baseline build's xconv_cpu_level(). */
#include "direct_conv.c"
#include "depthwise.c"
#include "small_cols.c"
#include "small_grid.c"

#ifndef XCONV_ISA
#define XCONV_ISA "baseline"
#endif

/* The name of this build's instruction set. */
const char *xconv_build_isa(void) { return XCONV_ISA; }

/* What this CPU (and its OS) runs: 2 for AVX-512 (F, BW, DQ, VL) with AVX2 and FMA, 1 for AVX2 and FMA, else 0. */
int xconv_cpu_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return avx2 ? (avx512 ? 2 : 1) : 0;
#else
    return 0;
#endif
}
