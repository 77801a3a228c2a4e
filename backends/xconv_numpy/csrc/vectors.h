/* The compiled loops' vectors (GCC vector extension) and their register transpositions: 16-float vectors (one
 * AVX-512 register, or two AVX ones), the 8-float vectors of the AVX2 build's dense blocks (DENSE_V8), the 16 x 16
 * transposition of GCC's vector shuffles (HAVE_TILE16) and the AVX2 build's 8 x 8 one (HAVE_TILE8). Included first
 * by direct_conv.c; the files kernels.c includes after it use these names. */
#ifndef XCONV_VECTORS_H
#define XCONV_VECTORS_H

#include <stdint.h>
#include <string.h>

#include "template.h"

typedef float v16 __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

static inline v16 load16(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16 v) { memcpy(p, &v, sizeof v); }
static inline v8f load8(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }

/* The AVX2 build's blocks hold 8-float vectors (one AVX register each: the 16-float blocks would need 56 registers
 * of 16): dx8_<n>x2 (n <= 6 positions x 16 channels, up to 12 accumulators; a row in blocks of nearly equal length,
 * not 6 + 6 + 2 for 14) and dw8_4x2 (4 output x 16 input channels). Each
 * output element is still one sum in the same order (taps, then channels; rows, then positions): the AVX-512
 * build's bits. */
#if defined(__AVX2__) && !defined(__AVX512F__)
#define DENSE_V8 1
#else
#define DENSE_V8 0
#endif

#if defined(__GNUC__) && !defined(__clang__)
typedef int32_t v16i __attribute__((vector_size(64)));

/* One stage of a 16 x 16 transposition in registers: rows i and i + D (bit D of i clear) exchange bit D of their
 * row and column index. After the stages D = 8, 4, 2, 1 row j holds column j. (A statement macro, not a
 * template: as an inline function of D, GCC schedules the dx blocks differently.) */
#define STAGE(D)                                                                                        \
    {                                                                                                   \
        v16i lo, hi;                                                                                    \
        for (int k = 0; k < 16; k++) {                                                                  \
            int b = k / (2 * D) * (2 * D), e = k % (2 * D);                                             \
            lo[k] = e < D ? b + e : 16 + b + e - D;                                                     \
            hi[k] = e < D ? b + D + e : 16 + b + e;                                                     \
        }                                                                                               \
        for (int i = 0; i < 16; i++)                                                                    \
            if (!(i & D)) {                                                                             \
                v16 a = t[i], c = t[i + D];                                                             \
                t[i] = __builtin_shuffle(a, c, lo);                                                     \
                t[i + D] = __builtin_shuffle(a, c, hi);                                                 \
            }                                                                                           \
    }

/* t[j][i] <- t[i][j] for i, j < 16 */
static inline void transpose16(v16 t[16]) {
    STAGE(8) STAGE(4) STAGE(2) STAGE(1)
}
#define HAVE_TILE16 1
#endif
#ifdef HAVE_TILE16
#define TILE_STORES 1
#else
#define TILE_STORES 0
#endif
#ifndef HAVE_TILE16
static inline void transpose16(v16 t[16]) { (void)t; }     /* never called: TILE_STORES is 0 */
#endif

/* The AVX2 build's transpositions: 8 x 8 tiles of AVX registers. (GCC emulates the 16-float shuffles of
 * transpose16 there element by element, through memory: the weights' tap-major copy of 128 x 128 x 3 x 3 x 3 took
 * 7% of its forward's time.) */
#if DENSE_V8
#include <immintrin.h>
#define HAVE_TILE8 1
typedef int32_t v8i __attribute__((vector_size(32)));
/* r[i] <- column i of the 8 x 8 tile whose row j is r[j] */
static inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#else
#define HAVE_TILE8 0
#endif

#endif
