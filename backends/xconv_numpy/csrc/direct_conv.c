/* Direct convolution loops for the NumPy backend (see ../compiled.py).
 *
 * Built at install once per instruction set (setup.py, through kernels.c) and loaded with ctypes. dy is a grid
 * of interleaved rows (element (channel c, row r, position j) of a sample at base + r * rp + c * ldy + j: every
 * channel's row r together), dx channel-major (channel c at base + c * ldc), x a channels-last grid per group. Every output element is computed by one call, in a fixed order, so
 * results do not depend on how a caller splits the work. Vectors are 16 floats (GCC vector extension:
 * one AVX-512 register, or two AVX ones); the 16 x 16 transpositions use GCC's vector shuffles (other
 * compilers take the element loops).
 */
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

/* dx_<NR>x<NV>: the block of direct_dx_block.h for NR positions and NV vectors of channels */
#define NR 14
#define NV 2
#include "direct_dx_block.h"
#define NR 13
#define NV 2
#include "direct_dx_block.h"
#define NR 12
#define NV 2
#include "direct_dx_block.h"
#define NR 11
#define NV 2
#include "direct_dx_block.h"
#define NR 10
#define NV 2
#include "direct_dx_block.h"
#define NR 9
#define NV 2
#include "direct_dx_block.h"
#define NR 8
#define NV 2
#include "direct_dx_block.h"
#define NR 7
#define NV 2
#include "direct_dx_block.h"
#define NR 6
#define NV 2
#include "direct_dx_block.h"
#define NR 5
#define NV 2
#include "direct_dx_block.h"
#define NR 4
#define NV 2
#include "direct_dx_block.h"
#define NR 2
#define NV 2
#include "direct_dx_block.h"
#define NR 1
#define NV 2
#include "direct_dx_block.h"
#define NR 12
#define NV 1
#include "direct_dx_block.h"
#define NR 4
#define NV 1
#include "direct_dx_block.h"
#define NR 2
#define NV 1
#include "direct_dx_block.h"
#define NR 1
#define NV 1
#include "direct_dx_block.h"

#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dx8_
#define NR 6
#define NV 2
#include "direct_dx_block.h"
#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dx8_
#define NR 5
#define NV 2
#include "direct_dx_block.h"
#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dx8_
#define NR 4
#define NV 2
#include "direct_dx_block.h"
#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dx8_
#define NR 3
#define NV 2
#include "direct_dx_block.h"
#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dx8_
#define NR 2
#define NV 2
#include "direct_dx_block.h"
#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dx8_
#define NR 1
#define NV 2
#include "direct_dx_block.h"

typedef void (*dx_block_fn)(const float *, int64_t, const float *, int64_t, const int64_t *, const int64_t *, int64_t,
                            int64_t, float *, int64_t, int64_t, int64_t, int64_t);

/* A block of n positions (1..14), 32 channels: n in one block when n >= 5 (the weights read once for the row's
 * positions: 2x512x7x7 -> 512 3x3 forward, one thread, 36 -> 49 G multiply-adds/s against 4 + 2 + 1 blocks), else
 * 4 + 2 + 1 blocks. Each position's sums are the same whatever its block. */
static void dx_span2(const float *dyr, int64_t ldy, const float *w, int64_t ldw, const int64_t *off,
                     const int64_t *cr, int64_t T, int64_t Cog, float *dxr, int64_t ldx, int64_t os, int64_t j,
                     int64_t n, int64_t cb) {
    static const dx_block_fn big[] = {dx_5x2, dx_6x2, dx_7x2, dx_8x2, dx_9x2, dx_10x2, dx_11x2, dx_12x2, dx_13x2,
                                      dx_14x2};
    if (n >= 5) { big[n - 5](dyr, ldy, w, ldw, off, cr, T, Cog, dxr, ldx, os, j, cb); return; }
    if (n >= 4) { dx_4x2(dyr, ldy, w, ldw, off, cr, T, Cog, dxr, ldx, os, j, cb); j += 4; n -= 4; }
    if (n >= 2) { dx_2x2(dyr, ldy, w, ldw, off, cr, T, Cog, dxr, ldx, os, j, cb); j += 2; n -= 2; }
    if (n >= 1) dx_1x2(dyr, ldy, w, ldw, off, cr, T, Cog, dxr, ldx, os, j, cb);
}

typedef void (*dx_taps_fn)(float *, const float *, int64_t, const float *, int64_t, const int64_t *, const int64_t *,
                           int64_t, int64_t, int64_t, int64_t, int64_t);

/* Blocks per chunk of dx_row_taps (their sums, 16 channels x 6 positions each, held in memory over the taps), and
 * the bytes of weights its taps take at a time */
#define DX_TAPS_CHUNK 10
#ifndef DX_TAPS_BYTES
#define DX_TAPS_BYTES (1 << 14)
#endif

/* The AVX2 build's row: positions [j, j + n) in blocks of (nearly) equal length, at most 6 positions x 16 channels,
 * run a few taps at a time (DX_TAPS_BYTES of their weights) over up to DX_TAPS_CHUNK blocks, the sums in memory
 * between: those taps' weights are read from L1 by every block of the chunk, where block by block every block read
 * all the taps' weights from L2. The same terms in the same order (taps, then channels) as dx8_<n>x2, so the same
 * bits. */
static void dx_row_taps(const float *dyr, int64_t ldy, const float *wr, int64_t ldw, const int64_t *offr,
                        const int64_t *crr, int64_t Tr, int64_t Cog, float *dxr, int64_t ldx, int64_t os, int64_t j0,
                        int64_t n, int64_t cb) {
    static const dx_taps_fn fn[] = {dx8_1x2_taps, dx8_2x2_taps, dx8_3x2_taps, dx8_4x2_taps, dx8_5x2_taps,
                                    dx8_6x2_taps};
    float acc[DX_TAPS_CHUNK * 6 * 16] __attribute__((aligned(64)));
    const int64_t nblk = (n + 5) / 6, q = n / nblk, extra = n % nblk;
    const int64_t tg = DX_TAPS_BYTES / (64 * Cog) > 1 ? DX_TAPS_BYTES / (64 * Cog) : 1;   /* taps at a time */
    for (int64_t b0 = 0; b0 < nblk; b0 += DX_TAPS_CHUNK) {
        const int64_t b1 = b0 + DX_TAPS_CHUNK < nblk ? b0 + DX_TAPS_CHUNK : nblk;
        const int64_t j = j0 + b0 * q + (b0 < extra ? b0 : extra);          /* the chunk's first position */
        const int64_t len = (b1 - b0) * q + (b1 < extra ? b1 : extra) - (b0 < extra ? b0 : extra);
        memset(acc, 0, (size_t)len * 16 * sizeof(float));
        for (int64_t t0 = 0; t0 < Tr; t0 += tg) {
            const int64_t t1 = t0 + tg < Tr ? t0 + tg : Tr;
            int64_t jj = j;
            for (int64_t b = b0; b < b1; b++) {
                const int64_t m = q + (b < extra);
                fn[m - 1](acc + (jj - j) * 16, dyr, ldy, wr, ldw, offr, crr, t0, t1, Cog, jj, cb);
                jj += m;
            }
        }
        for (int64_t c = 0; c < 16; c++)
            for (int64_t k = 0; k < len; k++) dxr[(cb + c) * ldx + (j + k) * os] = acc[k * 16 + c];
    }
}

/* One row's blocks for the input channels [cb, cb + 32) (AVX2 build: [cb, cb + 16)), or, with one = 1, for
 * [cb, cb + 16) in one vector of channels (the AVX-512 build's last 16 channels when Cg % 32 == 16). Row r: dy from
 * dy + rin[3 r], dx at dx + rout[r] with position step os, row_len positions; only taps [rin[3 r + 1], rin[3 r + 2])
 * of the phase's, the others reading only the dy grid's zero rows for this row: their terms are +0 and leave every
 * sum's bits as they are. The tap table off: the T taps' offsets, then per tap the positions [lo, hi) of a row that
 * read dy's columns (the block skips the others' terms in the same way). */
static void dx_row(const float *dy, int64_t ldy, const float *w, int64_t ldw, const int64_t *off, int64_t T,
                   int64_t Cog, float *dx, int64_t ldx, int64_t os, const int64_t *rin, const int64_t *rout,
                   int64_t r, int64_t j0, int64_t n, int64_t cb, int one) {
    const float *dyr = dy + rin[3 * r];
    float *dxr = dx + rout[r];
    const int64_t *offr = off + rin[3 * r + 1];                     /* the row's taps */
    const int64_t *crr = off + T + 2 * rin[3 * r + 1];              /* and their positions reading dy's values */
    const float *wr = w + rin[3 * r + 1] * Cog * ldw;
    const int64_t Tr = rin[3 * r + 2] - rin[3 * r + 1];
    const int64_t row_len = j0 + n;                                 /* positions [j0, j0 + n) of the row */
    int64_t j = j0;
    const int64_t tap_bytes = 16 * sizeof(float) * Cog;             /* a tap's weights for 16 channels */
    if (DENSE_V8 && tap_bytes <= DX_TAPS_BYTES && Tr * tap_bytes > 2 * DX_TAPS_BYTES) {   /* the row's: past L1 */
        dx_row_taps(dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, n, cb);
        return;
    }
    if (DENSE_V8) {                      /* AVX2: 16 channels in blocks of (nearly) equal length, 6 positions at most */
        static const dx_block_fn v8[] = {dx8_1x2, dx8_2x2, dx8_3x2, dx8_4x2, dx8_5x2, dx8_6x2};
        const int64_t nblk = (n + 5) / 6;
        for (int64_t b = 0; b < nblk; b++) {
            const int64_t m = n / nblk + (b < n % nblk);
            v8[m - 1](dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, cb);
            j += m;
        }
        return;
    }
    if (one) {                           /* one vector of channels: as many 12-blocks as fit (one load per FMA) */
        for (; j + 12 <= row_len; j += 12) dx_12x1(dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, cb);
        for (; j + 4 <= row_len; j += 4) dx_4x1(dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, cb);
        for (; j + 2 <= row_len; j += 2) dx_2x1(dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, cb);
        for (; j < row_len; j++) dx_1x1(dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, cb);
        return;
    }
    int64_t nblk = (n + 13) / 14;        /* blocks of (nearly) equal length: 8 to 14 positions, no short one */
    for (int64_t b = 0; b < nblk; b++) {
        int64_t m = n / nblk + (b < n % nblk);
        dx_span2(dyr, ldy, wr, ldw, offr, crr, Tr, Cog, dxr, ldx, os, j, m, cb);
        j += m;
    }
}

/* The phase's weights, bytes, past which rows [r0, r1) run channel block by channel block (each block's weights
 * kept in L2 over the rows) rather than row by row (each row's dy kept in cache over the blocks, every row reading
 * all of the weights: 2x256x14x14 -> 256 3x3, 2.4 MB of weights, ran at half the rate of 128 channels). */
#define DX_BLOCKS_OUTER_BYTES (1 << 20)

/* Input gradient of rows [r0, r1) of one group (see dx_row), channels [c0, c1) of its Cg (c0, c1 multiples of 32, or
 * 0 and Cg), Cg % 16 == 0: 32 channels at a time in ceil(row_len / 14) blocks of (nearly) equal length, then 16
 * channels at a time (the AVX2 build: 16 at a time). Every block is one call whatever the order, so the order changes
 * no bit. */
static void dx_rows(const float *dy, int64_t ldy, const float *w, int64_t ldw, const int64_t *off, int64_t T,
                    int64_t Cog, int64_t Cg, float *dx, int64_t ldx, int64_t os, const int64_t *rin,
                    const int64_t *rout, int64_t r0, int64_t r1, int64_t row_len, int64_t c0, int64_t c1) {
    const int64_t step = DENSE_V8 ? 16 : 32;
    const int64_t wide = Cg / step * step;                          /* channels in blocks of `step` */
    if (4 * T * Cog * Cg > DX_BLOCKS_OUTER_BYTES) {
        for (int64_t cb = c0; cb < c1; cb += cb < wide ? step : 16)
            for (int64_t r = r0; r < r1; r++)
                dx_row(dy, ldy, w, ldw, off, T, Cog, dx, ldx, os, rin, rout, r, 0, row_len, cb, cb >= wide);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        for (int64_t cb = c0; cb < c1; cb += cb < wide ? step : 16)
            dx_row(dy, ldy, w, ldw, off, T, Cog, dx, ldx, os, rin, rout, r, 0, row_len, cb, cb >= wide);
}

/* The channel units of a phase's items (xconv_dx_rows): Cg / 32 where its rows run channel block by channel block
 * (weights past DX_BLOCKS_OUTER_BYTES) and Cg % 32 == 0, else 1. Items of one unit share its weights only: a task
 * of a few units reads a few blocks' weights, where a task of rows read them all (2x256x14x14 -> 256 3x3 forward, two
 * threads: every task read all 2.4 MB of weights). */
int64_t xconv_dx_units(int64_t T, int64_t Cog, int64_t Cg) {
    return 4 * T * Cog * Cg > DX_BLOCKS_OUTER_BYTES && Cg % 32 == 0 ? Cg / 32 : 1;
}

/* Long rows (past 2 spans) where the rows run channel block by channel block: a span's dy for every input channel
 * (DX_SPAN_FLOATS floats, at least DX_SPAN_MIN positions, then rounded down to whole blocks of the widest size)
 * stays in L2 over the task's channel units, where each unit streamed the whole row again (the speech encoder's
 * 4x512x3199 -> 512 3-tap stride-2 forward read 16 x 26 MB of x's phase rows). */
#define DX_SPAN_FLOATS (1 << 16)
#define DX_SPAN_MIN 64

/* xconv_dx_rows's items [i0, i1) row by row, each row span by span, each span over the items' channel units: the
 * same blocks' sums (a position's sums are the same whatever its block), in another order. */
static void dx_rows_spans(const float *dy, int64_t ldy, int64_t sdy, const float *w, int64_t ldw, int64_t sw,
                          const int64_t *off, int64_t T, int64_t Cog, int64_t Cg, float *dx, int64_t ldx, int64_t sdx,
                          int64_t os, const int64_t *rin, const int64_t *rout, int64_t nr, int64_t i0, int64_t i1,
                          int64_t row_len, int64_t units, int64_t span) {
    const int64_t step = DENSE_V8 ? 16 : 32, wide = Cg / step * step, cu = Cg / units;
    for (int64_t gi = i0 / (nr * units); gi * nr * units < i1; gi++)
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j0 = 0; j0 < row_len; j0 += span) {
                const int64_t n = row_len - j0 < span ? row_len - j0 : span;
                for (int64_t u = 0; u < units; u++) {
                    const int64_t item = (gi * units + u) * nr + r;
                    if (item < i0 || item >= i1)
                        continue;
                    for (int64_t cb = u * cu; cb < (u + 1) * cu; cb += cb < wide ? step : 16)
                        dx_row(dy + gi * sdy, ldy, w + gi * sw, ldw, off, T, Cog, dx + gi * sdx, ldx, os, rin, rout, r,
                               j0, n, cb, cb >= wide);
                }
            }
}

/* Input gradient of items [i0, i1) of (group, channel unit, row) triples, nr rows per unit and
 * xconv_dx_units(T, Cog, Cg) units per group: group gi's dy, w and dx start sdy, sw and sdx floats after those of
 * group gi - 1 (so one call may cover rows of several groups). */
void xconv_dx_rows(const float *dy, int64_t ldy, int64_t sdy, const float *w, int64_t ldw, int64_t sw,
                   const int64_t *off, int64_t T, int64_t Cog, int64_t Cg, float *dx, int64_t ldx, int64_t sdx,
                   int64_t os, const int64_t *rin, const int64_t *rout, int64_t nr, int64_t i0, int64_t i1,
                   int64_t row_len) {
    const int64_t units = xconv_dx_units(T, Cog, Cg), cu = Cg / units;
    const int64_t block = DENSE_V8 ? 6 : 14;                       /* a span of whole blocks: the widest */
    const int64_t span = (DX_SPAN_FLOATS / Cog > DX_SPAN_MIN ? DX_SPAN_FLOATS / Cog : DX_SPAN_MIN) / block * block;
    if (units > 1 && row_len > 2 * span) {
        dx_rows_spans(dy, ldy, sdy, w, ldw, sw, off, T, Cog, Cg, dx, ldx, sdx, os, rin, rout, nr, i0, i1, row_len, units,
                      span);
        return;
    }
    for (int64_t gu = i0 / nr; gu * nr < i1; gu++) {
        const int64_t gi = gu / units, u = gu % units;
        int64_t a = i0 > gu * nr ? i0 - gu * nr : 0, b = i1 < (gu + 1) * nr ? i1 - gu * nr : nr;
        dx_rows(dy + gi * sdy, ldy, w + gi * sw, ldw, off, T, Cog, Cg, dx + gi * sdx, ldx, os, rin, rout, a, b,
                row_len, u * cu, (u + 1) * cu);
    }
}


/* dw_<RC>x<NV>: the block of direct_dw_block.h for RC output channels and NV vectors of input channels */
#define RC 16
#define NV 1
#include "direct_dw_block.h"
#define RC 8
#define NV 2
#include "direct_dw_block.h"
#define VT v8f
#define VW 8
#define LOADV load8
#define PRE dw8_
#define RC 4
#define NV 2
#include "direct_dw_block.h"


/* Weight gradient of the tasks [k0, k1) of the list (t, ci block, co block), in that order (consecutive tasks share
 * the segment's x columns, kept in L1 across the output-channel blocks: one thread, 2x256x14x14 -> 256 3x3 3.56-3.60
 * -> 3.37-3.45 ms, 2x128x4x14x14 -> 128 3x3x3 73-75 -> 76-78 G multiply-adds/s; each task's sums are its own, so
 * the order changes no bit), over rows r < nrows of
 * dy positions (channel co of row r at dy + rdy[r] + co * ldy + j) and x positions (channels-last:
 * x + (rx[r] + j * xs + off[t]) * ldx for position j of the row, xs the stride):
 *   dw[(t * Cog + co) * Cg + ci] = sum_r sum_{j < row_len} dy[co, row r, j] * x[row r, j * xs + off[t], ci]
 * over the terms whose x is in the input only where the tap table says so (off: per tap t < K its offset off[t], then
 * the positions [off[K + 2t], off[K + 2t + 1]) of a row whose x is in the input, then the rows R of a sample, then
 * bytes, K a row: whether row r's x row for tap t is, row r taken as r % R; the caller's table says all where dy may
 * hold an inf or a NaN, whose products with the padding's zeros are terms of dw: the other products it skips are
 * exact zeros, so no bit changes).
 * Blocks are 8 output x 32 input channels when Cg % 32 == 0 (half the loads per FMA), else 16 x 16: the same
 * number of tasks, (Cog / 16) * (Cg / 16) per tap. Rows and positions are taken in increasing order, in
 * segments of about OB positions (each segment for all the tasks: the caller sizes OB so that a segment's data
 * stays in cache). Cog % 16 == 0, Cg % 16 == 0. */
static void dw_rows(const float *dy, int64_t ldy, const float *x, int64_t ldx, int64_t xs, const int64_t *off,
                    int64_t K, int64_t Cog, int64_t Cg, const int64_t *rdy, const int64_t *rx, int64_t nrows,
                    int64_t row_len, int64_t OB, float *dw, int64_t k0, int64_t k1) {
    int wide = Cg % 32 == 0;
    int64_t bco = wide ? 8 : 16, bci = wide ? 32 : 16;
    int64_t nco = Cog / bco, nci = Cg / bci;
    const int64_t *cols = off + K;                   /* per tap: the positions [lo, hi) whose x is in the input */
    const int64_t R = off[3 * K];                    /* rows of a sample: row r's bytes are those of r % R */
    const uint8_t *ok = (const uint8_t *)(off + 3 * K + 1);
    for (int64_t k = k0; k < k1; k++) {
        int64_t t = k / (nco * nci), cb = (k / nco) % nci * bci, c0 = k % nco * bco;
        for (int c = 0; c < bco; c++) memset(dw + (t * Cog + c0 + c) * Cg + cb, 0, bci * sizeof(float));
    }
    /* a segment: rows [r0, r1) and positions [o0, o1) of each: whole rows when a row is shorter than OB */
    int64_t rows_per_seg = row_len >= OB ? 1 : OB / row_len;
    for (int64_t r0 = 0; r0 < nrows; r0 += rows_per_seg) {
        int64_t r1 = r0 + rows_per_seg < nrows ? r0 + rows_per_seg : nrows;
        for (int64_t o0 = 0; o0 < row_len; o0 += OB) {
            int64_t o1 = o0 + OB < row_len ? o0 + OB : row_len;
            for (int64_t k = k0; k < k1; k++) {
                int64_t t = k / (nco * nci), cb = (k / nco) % nci * bci, c0 = k % nco * bco;
                int64_t a = o0 > cols[2 * t] ? o0 : cols[2 * t], b = o1 < cols[2 * t + 1] ? o1 : cols[2 * t + 1];
                float *out = dw + (t * Cog + c0) * Cg + cb;
                if (a >= b)
                    continue;
                if (DENSE_V8) {          /* AVX2: the task in blocks of 4 output x 16 input channels */
                    for (int64_t c = 0; c < bco; c += 4)
                        for (int64_t i = 0; i < bci; i += 16)
                            dw8_4x2(dy, ldy, x, ldx, xs * ldx, off[t], rdy, rx, ok + t, K, R, r0, r1, a, b, c0 + c,
                                    cb + i, out + c * Cg + i, Cg);
                } else if (wide)
                    dw_8x2(dy, ldy, x, ldx, xs * ldx, off[t], rdy, rx, ok + t, K, R, r0, r1, a, b, c0, cb, out, Cg);
                else
                    dw_16x1(dy, ldy, x, ldx, xs * ldx, off[t], rdy, rx, ok + t, K, R, r0, r1, a, b, c0, cb, out, Cg);
            }
        }
    }
}

/* Weight gradient of items [i0, i1) of (group, task) pairs, nk tasks per group: group gi's dy, x and dw start
 * sdy, sx and sdw floats after those of group gi - 1. */
void xconv_dw_rows(const float *dy, int64_t ldy, int64_t sdy, const float *x, int64_t ldx, int64_t sx, int64_t xs,
                   const int64_t *off, int64_t Cog, int64_t Cg, const int64_t *rdy, const int64_t *rx, int64_t nrows,
                   int64_t row_len, int64_t OB, float *dw, int64_t sdw, int64_t nk, int64_t i0, int64_t i1) {
    for (int64_t gi = i0 / nk; gi * nk < i1; gi++) {
        int64_t a = i0 > gi * nk ? i0 - gi * nk : 0, b = i1 < (gi + 1) * nk ? i1 - gi * nk : nk;
        dw_rows(dy + gi * sdy, ldy, x + gi * sx, ldx, xs, off, nk / ((Cog / 16) * (Cg / 16)), Cog, Cg, rdy, rx,
                nrows, row_len, OB, dw + gi * sdw, a, b);
    }
}


/* Channels [c0, c1) and positions [u0, u1) of one sample's x, channel-major (channel c at src + c * ldc), into
 * its grids, one per group of Cg channels (group gi's at dst + gi * gs), channels-last with ps floats per position
 * (0: Cg; more: padded rows, as the dense loops' weights take them); *bad |= 1 (bad not NULL) where a value copied is
 * an inf or a NaN (the dense forward's weights: checked in their copy, not in a pass of their own):
 *   grid[pos[u] * ps + c % Cg] = src[c * ldc + u],   and grid[pad[k] * ps + c % Cg] = 0 for k < npad,
 * pos and pad together covering a grid once; c0, c1 and Cg multiples of 16. In 16 x 16 register
 * transpositions where the compiler has vector shuffles (consecutive x positions, each stored to its own grid
 * position; the AVX2 build: 8 x 8, the last 1..7 positions element by element). */
void xconv_x_to_grid(const float *src, int64_t ldc, int64_t c0, int64_t c1, int64_t Cg, int64_t gs,
                     const int64_t *pos, int64_t u0, int64_t u1, const int64_t *pad, int64_t npad, float *dst,
                     int64_t ps, int64_t *bad) {
    if (ps == 0) ps = Cg;
    uint32_t any = 0;                    /* bad: set when a value copied is an inf or a NaN (all exponent bits set) */
    for (int64_t cb = c0; cb < c1; cb += 16) {
        const float *s = src + cb * ldc;
        float *d = dst + cb / Cg * gs + cb % Cg;
        for (int64_t k = 0; k < npad; k++) memset(d + pad[k] * ps, 0, 16 * sizeof(float));
        int64_t u = u0;
#if HAVE_TILE8
        v8i odd8 = {0};
        for (; u + 8 <= u1; u += 8)
            for (int h = 0; h < 2; h++) {          /* channels 8 h .. 8 h + 7 of positions u .. u + 7 */
                __m256 r[8];
                for (int i = 0; i < 8; i++) {
                    r[i] = _mm256_loadu_ps(s + (8 * h + i) * ldc + u);
                    if (bad) odd8 |= ((v8i)r[i] & 0x7f800000) == 0x7f800000;
                }
                transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + pos[u + i] * ps + 8 * h, r[i]);
            }
        for (int i = 0; i < 8; i++) any |= (uint32_t)odd8[i];
#elif defined(HAVE_TILE16)
        v16i odd = {0};
        for (; u + 16 <= u1; u += 16) {
            v16 t[16];
            for (int i = 0; i < 16; i++) {
                t[i] = load16(s + i * ldc + u);
                if (bad) odd |= ((v16i)t[i] & 0x7f800000) == 0x7f800000;
            }
            transpose16(t);
            for (int i = 0; i < 16; i++) store16(d + pos[u + i] * ps, t[i]);
        }
        if (u < u1) {                    /* the last 1..15 positions: one tile, zero-filled (a weight's K taps) */
            const int64_t m = u1 - u;
            v16i keep;                   /* lanes [0, m): a row's 16-float load past them is masked to +0 */
            for (int k = 0; k < 16; k++) keep[k] = k < m ? -1 : 0;
            v16 t[16];
            for (int i = 0; i < 16; i++) {
                if (i * ldc + u + 16 <= 15 * ldc + u1) {     /* 16 floats inside the block's last row */
                    t[i] = (v16)((v16i)load16(s + i * ldc + u) & keep);
                } else {
                    t[i] = (v16){0};
                    memcpy(&t[i], s + i * ldc + u, (size_t)m * sizeof(float));
                }
                if (bad) odd |= ((v16i)t[i] & 0x7f800000) == 0x7f800000;
            }
            transpose16(t);
            for (int64_t i = 0; i < m; i++) store16(d + pos[u + i] * ps, t[i]);
            u = u1;
        }
        for (int i = 0; i < 16; i++) any |= (uint32_t)odd[i];
#endif
        for (; u < u1; u++)
            for (int64_t c = 0; c < 16; c++) {
                float v = s[c * ldc + u];
                uint32_t bits;
                memcpy(&bits, &v, sizeof bits);
                any |= (bits & 0x7f800000u) == 0x7f800000u;
                d[pos[u] * ps + c] = v;
            }
    }
    if (bad && any) __atomic_fetch_or(bad, 1, __ATOMIC_RELAXED);
}

/* Rows [r0, r1) of dst = src transposed, dst[r * K + t] = src[t * R + r] for t < K: the weight gradient from the
 * loops' tap-major sums to the weights' layout (taps last). 16 rows at a time in a register transposition when
 * K <= 16 and the compiler has vector shuffles (the AVX2 build: 8 rows and 8 taps at a time, any K), else (and for
 * the last rows) element by element. */
void xconv_taps_last(const float *src, int64_t K, int64_t R, float *dst, int64_t r0, int64_t r1) {
    int64_t r = r0;
#if HAVE_TILE8
    for (; r + 8 <= r1; r += 8)                     /* 8 rows at a time, taps 8 at a time (the AVX2 build: any K) */
        for (int64_t t0 = 0; t0 < K; t0 += 8) {
            const int64_t m = K - t0 < 8 ? K - t0 : 8;
            __m256 q[8];
            for (int i = 0; i < 8; i++) q[i] = i < m ? _mm256_loadu_ps(src + (t0 + i) * R + r) : _mm256_setzero_ps();
            transpose8(q);
            for (int i = 0; i < 8; i++) memcpy(dst + (r + i) * K + t0, &q[i], m * sizeof(float));
        }
#elif defined(HAVE_TILE16)
    if (K <= 16)
        for (; r + 16 <= r1; r += 16) {
            v16 t[16];
            for (int i = 0; i < 16; i++) t[i] = i < K ? load16(src + i * R + r) : (v16){0};
            transpose16(t);
            for (int i = 0; i < 16; i++) memcpy(dst + (r + i) * K, &t[i], K * sizeof(float));
        }
#endif
    for (; r < r1; r++)
        for (int64_t t = 0; t < K; t++) dst[r * K + t] = src[t * R + r];
}

/* Rows [r0, r1) of one sample's dy (C channels of n positions, channel c at src + c * n) into its zero-padded grid
 * of interleaved rows (dense_plan.plan): M zeros (written with row 0), then nrows rows of the C channels' row_len
 * positions each, channel c of row r at dst + M + (r * C + c) * row_len (olen values from src + c * n + rsrc[r] and
 * zeros after them, or only zeros where rsrc[r] < 0), then zeros up to `size` floats (written with the last row). If
 * sums is not NULL, sums[c] = the sum of channel c's values copied, in double precision, in order (rows, then
 * positions: 8 lanes of partial sums, added last). */
void xconv_dy_to_grid(const float *src, int64_t C, int64_t n, const int64_t *rsrc, int64_t nrows, int64_t row_len,
                      int64_t olen, int64_t M, int64_t size, int64_t r0, int64_t r1, float *dst, double *sums) {
    const int64_t rp = C * row_len;
    if (r0 == 0) memset(dst, 0, M * sizeof(float));
    if (r1 == nrows) memset(dst + M + nrows * rp, 0, (size - M - nrows * rp) * sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        const float *s = src + c * n;
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        v8d acc = {0, 0, 0, 0, 0, 0, 0, 0};
        float *d = dst + M + r0 * rp + c * row_len;
        for (int64_t r = r0; r < r1; r++, d += rp) {
            int64_t k = 0;
            if (rsrc[r] >= 0) {
                memcpy(d, s + rsrc[r], olen * sizeof(float));
                k = olen;
                if (sums) {
                    const float *q = s + rsrc[r];
                    int64_t u = 0;
                    for (; u + 8 <= olen; u += 8) {
                        v8f v;
                        memcpy(&v, q + u, sizeof v);
                        acc += __builtin_convertvector(v, v8d);
                    }
                    for (; u < olen; u++) part[u % 8] += q[u];
                }
            }
            memset(d + k, 0, (row_len - k) * sizeof(float));
        }
        if (sums) {
            for (int k = 0; k < 8; k++) part[k] += acc[k];
            sums[c] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        }
    }
}
