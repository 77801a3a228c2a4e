/* Every compiled loop of the NumPy backend in one library (loaded by ../native.py). setup.py builds
 * it once per instruction set (kernels_<isa>.c include this file; XCONV_ISA names the build) and the loader
 * picks the best one the CPU runs, asking the baseline build's xconv_cpu_level(), and checks that the build's
 * argument layout (layout.h; xconv_layout, xconv_layout_slots) is the one ../layout.py declares.
 *
 * One template idiom throughout (template.h): a template header instantiated by #define-ing its parameters and
 * including it (element types T/SUF, block shapes NR/NV); XCONV_CAT the only token paste. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>            /* first, as Python asks: template_run.c reads the call's arrays' buffers */
#include "layout.h"
#include "direct_conv.c"
#include "grid_copy.c"
#include "depthwise_cv.c"
#include "depthwise.c"
#include "small_cols.c"
#include "small_grid.c"
#include "bias_sum.c"
#include "stem.c"
#include "finite.c"
#include "jobs.c"
#include "template_run.c"

#ifndef XCONV_ISA
#define XCONV_ISA "baseline"
#endif

/* The argument layout of this build (layout.h): which = 0 gives XCONV_LAYOUT_VERSION, which = XCONV_LAYOUT_* the
 * length of that vector (for the stride-1 plan: its fixed head, before the taps' offsets); -1 for another which. */
int64_t xconv_layout(int which) {
    switch (which) {
    case 0: return XCONV_LAYOUT_VERSION;
    case XCONV_LAYOUT_DEPTHWISE_GEO: return G_LEN;
    case XCONV_LAYOUT_SMALL_COLS_GEO: return S_LEN;
    case XCONV_LAYOUT_SMALL_S1_PLAN: return P_LEN;
    case XCONV_LAYOUT_SMALL_S1_STRIDES: return E_LEN;
    case XCONV_LAYOUT_BIAS_GEO: return B_LEN;
    default: return -1;
    }
}

/* The slots of vector `which` in order, "NAME:width NAME:width ..." (layout.h's lists); NULL for another which. */
const char *xconv_layout_slots(int which) {
    switch (which) {
    case XCONV_LAYOUT_DEPTHWISE_GEO: return XCONV_DEPTHWISE_GEO(XCONV_SLOT_TEXT);
    case XCONV_LAYOUT_SMALL_COLS_GEO: return XCONV_SMALL_COLS_GEO(XCONV_SLOT_TEXT);
    case XCONV_LAYOUT_SMALL_S1_PLAN: return XCONV_SMALL_S1_PLAN(XCONV_SLOT_TEXT);
    case XCONV_LAYOUT_SMALL_S1_STRIDES: return XCONV_SMALL_S1_STRIDES(XCONV_SLOT_TEXT);
    case XCONV_LAYOUT_BIAS_GEO: return XCONV_BIAS_GEO(XCONV_SLOT_TEXT);
    default: return 0;
    }
}

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
