/* Direct convolution loops for the NumPy backend (see ../dense.py): the input-gradient rows (the forward's too, on
 * the dual's weights) and the weight-gradient blocks.
 *
 * Built at install once per instruction set (setup.py, through kernels.c) and loaded with ctypes. dy is a grid
 * of interleaved rows (element (channel c, row r, position j) of a sample at base + r * rp + c * ldy + j: every
 * channel's row r together), dx channel-major (channel c at base + c * ldc), x a channels-last grid per group
 * (their copies: grid_copy.c). Every output element is computed by one call, in a fixed order, so results do not
 * depend on how a caller splits the work. Vectors (vectors.h) are 16 floats, or 8 in the AVX2 build's blocks.
 */
#include "vectors.h"

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

/* dx_row_taps's shape: blocks per chunk (their sums, 16 channels x 6 positions each, held in memory over the taps),
 * the bytes of weights a chunk's blocks take at a time (whole taps, at least one), and the row's weights past which
 * a row runs that way (dx_row). Measured, one thread, AVX2 build on Zen 3, min of 3 alternating runs, ms, bytes at a
 * time 16K / 24K / 32K: 2x128x4x14x14 -> 128 3x3x3 forward 17.8 / 17.4 / 19.2, 4x128x32x32 -> 64 3x3 9.5 / 8.8 /
 * 10.0, 2x64x56x56 -> 64 6.4 / 6.2 / 6.9; below DX_TAPS_MIN block by block (4x32x64x64 -> 32 3x3, 18 KiB: 3.46 block
 * by block, 3.77 taps at a time). */
#define DX_TAPS_CHUNK 10
#define DX_TAPS_BYTES (24 << 10)
#define DX_TAPS_MIN (32 << 10)

/* Whether a row of T taps over Cog dy channels (the forward's input channels per group) runs taps at a time: the AVX2
 * build, a tap's weights for 16 channels within DX_TAPS_BYTES and the row's past DX_TAPS_MIN (else block by block,
 * the row's weights in L1). dx_row's test, and the cost model's (dense.taps_at_a_time). */
int64_t xconv_dx_taps_rows(int64_t T, int64_t Cog) {
    const int64_t tap_bytes = 16 * (int64_t)sizeof(float) * Cog;
    return DENSE_V8 && tap_bytes <= DX_TAPS_BYTES && T * tap_bytes > DX_TAPS_MIN;
}

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
    if (n <= 0)
        return;
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
    if (xconv_dx_taps_rows(Tr, Cog)) {                  /* AVX2: the row's weights past L1, a tap's not */
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
