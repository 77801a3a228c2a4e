/* Stride-1 loops of the NumPy backend's small-call path (see ../small_c.py), in float and double.
 *
 * Tensors live on zero-padded channel-major grids: channel c's planes at c * ldc, sample n's plane at n * ps,
 * one flat position per element. A stride-1 correlation then reads tap t of position r at a fixed flat offset
 * off[t], so every sum below runs over vectors of consecutive positions:
 *
 *   fill: grid[c * ldc + n * ps + flat(at + e)] = src[n, c, e] for e in the kept box, 0 elsewhere in [0, ldc) and in
 *         the tail after the last channel (what vector loads may read past a plane; it must be finite);
 *   corr: out[o * ldo + n * rows + r] = sum over i < Cig, t < K (in order) of w[o][i][t] * in[(g Cig + i) * ldi +
 *         base + off[t] + n * ps + r] for r < rows, o in group g (forward; the input gradient with the weights
 *         flipped and transposed);
 *   dw:   dw[o][i][t] = sum over n, r < R of dz[o * ldz + n * R + r] * in[(g Cig + i) * ldi + base + off[t] + n * ps + r]
 *         (dz zero wherever no output lies), each sum in lanes of a vector, then the lanes in order.
 *
 * Every output element is one fixed sequence of operations for given shapes and build: bitwise reproducible. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "template.h"

#if defined(__AVX512F__)
#define SG_BYTES 64
#elif defined(__AVX__)
#define SG_BYTES 32
#else
#define SG_BYTES 16
#endif

/* fill geo: N, C, kept extents (d, h, w), src element strides (n, c, d, h, w), grid dims (d, h, w), at (d, h, w),
 * ps, ldc, tail */
enum { F_N, F_C, F_KD, F_KH, F_KW, F_SN, F_SC, F_SD, F_SH, F_SW, F_GD, F_GH, F_GW, F_AD, F_AH, F_AW, F_PS, F_LDC,
       F_TAIL };
/* corr / dw geo: N, groups, Cig, Cog, K, rows, ps, ldi, base, ldo (corr) or R (dw) */
enum { C_N, C_G, C_CIG, C_COG, C_K, C_ROWS, C_PS, C_LDI, C_BASE, C_LDO };
/* a whole call's plan (small_c.py, _s1_plan): csrc/layout.h's XCONV_SMALL_S1_PLAN (P_*); x's and dy's element
 * strides: XCONV_SMALL_S1_STRIDES */
/* elements after a grid's last channel that vector loads may read (zeros); allocated here with each grid and
 * counted in the scratch bytes reported (no Python counterpart) */
#define SG_SLACK 16

/* On AVX-512 builds the bias gradient's (and the finiteness check's) sums over float dy with unit element stride keep
 * their 8 double lanes in one register: in scalar code they cost about 0.7 ns an element, as much as the weight
 * gradient's sums (64x1x8x8 -> 16 3x3: 46 of the weight gradient's 100 us; now 16) */
#if defined(__AVX512F__)
#include <immintrin.h>
#define SG_AVX512_BIAS 1
#else
#define SG_AVX512_BIAS 0
#endif

#define T float
#define SUF _f32
#include "small_grid_impl.h"
#undef T
#undef SUF
#undef SG_AVX512_BIAS
#define SG_AVX512_BIAS 0

#define T double
#define SUF _f64
#include "small_grid_impl.h"
#undef T
#undef SUF
