/* A template (see template.h) of direct_conv.c: the input-gradient block dx_<NR>x<NV>, NR positions j.. of a row
 * and VW * NV input channels from cb (VW floats per vector: 16, or 8 in the AVX2 build's blocks):
 *   dx[rout + (cb + ci) * ldx + (j + k) * os] = sum_t sum_co dy[rin + co * ldy + j + k - off[t]] * w[(t * Cog + co) * ldw + cb + ci]
 * taps in order, channels in order within a tap (os: the output's position step, the stride on a phase). Tap t runs
 * only the positions [cr[2 t], cr[2 t + 1]) of the row (those reading dy's values; the others read the grid's zeros,
 * and their terms, +0 with the finite weights the loops get, leave every sum's bits as they are: a sum that starts at
 * +0 is never -0), at most 2 skipped at each end of the block (more run as zeros), the ranges' ends constants of an
 * inlined copy of the tap's loop (the sums stay in registers). */

#ifndef VW                 /* the vector: 16 floats (v16) unless the instantiation names another (VT, VW, LOADV) */
#define VT v16
#define VW 16
#define LOADV load16
#define PRE dx_
#endif
#define NAME XCONV_CAT(XCONV_CAT(XCONV_CAT(PRE, NR), x), NV)
#define TAPS XCONV_CAT(NAME, _tap)
/* one tap's terms for the block's positions [KLO, KHI) (constants where inlined: the accumulators stay registers) */
static inline __attribute__((always_inline)) void TAPS(VT acc[NR][NV], const float *d, int64_t ldy,
                                                       const float *wt, int64_t ldw, int64_t Cog, const int KLO,
                                                       const int KHI) {
    #pragma GCC unroll 2
    for (int64_t co = 0; co < Cog; co++) {
        VT wv[NV];
        for (int v = 0; v < NV; v++) wv[v] = LOADV(wt + co * ldw + VW * v);
        const float *dc = d + co * ldy;
        #pragma GCC unroll 14
        for (int k = KLO; k < KHI; k++) {
            float b = dc[k];
            for (int v = 0; v < NV; v++) acc[k][v] += b * wv[v];
        }
    }
}

/* The body of a loop over taps t (statement macro, expanded in NAME and its _taps variant: as an inline function GCC
 * compiled the dx blocks differently): tap t's terms for the block's positions that read dy's values, [a, b) relative
 * to the block; none where every position reads zeros; at most 2 skipped at each end, more run as zeros (the ranges'
 * ends constants of an inlined copy of TAPS). */
#define DX_TAP_RANGE                                                                                            \
    const int64_t a = cr[2 * t] - j, b = cr[2 * t + 1] - j;         /* positions [a, b) read dy's values */     \
    if (a <= 0 && b >= NR) {                                                                                    \
        TAPS(acc, d, ldy, wt, ldw, Cog, 0, NR);                                                                 \
        continue;                                                                                               \
    }                                                                                                           \
    if (a >= b || b <= 0 || a >= NR)                                                                            \
        continue;                                                                                               \
    const int lo = a < 2 ? (int)a : 2, hi = NR - b < 2 ? (int)(NR - b) : 2;                                     \
    switch (3 * (lo < 0 ? 0 : lo) + (hi < 0 ? 0 : hi)) {                                                        \
    case 0: TAPS(acc, d, ldy, wt, ldw, Cog, 0, NR); break;                                                      \
    case 1: TAPS(acc, d, ldy, wt, ldw, Cog, 0, NR - 1); break;                                                  \
    case 2: TAPS(acc, d, ldy, wt, ldw, Cog, 0, NR - 2); break;                                                  \
    case 3: TAPS(acc, d, ldy, wt, ldw, Cog, 1, NR); break;                                                      \
    case 4: TAPS(acc, d, ldy, wt, ldw, Cog, 1, NR - 1); break;                                                  \
    case 5: TAPS(acc, d, ldy, wt, ldw, Cog, 1, NR - 2); break;                                                  \
    case 6: TAPS(acc, d, ldy, wt, ldw, Cog, 2, NR); break;                                                      \
    case 7: TAPS(acc, d, ldy, wt, ldw, Cog, 2, NR - 1); break;                                                  \
    default: TAPS(acc, d, ldy, wt, ldw, Cog, 2, NR - 2); break;                                                 \
    }

static inline void NAME(const float *dyr, int64_t ldy, const float *w, int64_t ldw, const int64_t *off,
                        const int64_t *cr, int64_t T, int64_t Cog, float *dxr, int64_t ldx, int64_t os, int64_t j,
                        int64_t cb) {
    VT acc[NR][NV];
    for (int k = 0; k < NR; k++)
        for (int v = 0; v < NV; v++) acc[k][v] = (VT){0};
    for (int64_t t = 0; t < T; t++) {
        const float *d = dyr + j - off[t];
        const float *wt = w + t * Cog * ldw + cb;
        DX_TAP_RANGE
    }
#if VW == 16
    if (TILE_STORES && NR <= 16 && os == 1) {  /* a channel's positions contiguous: transpose, store */
        for (int v = 0; v < NV; v++) {
            v16 t[16];
            for (int k = 0; k < 16; k++) t[k] = k < NR ? acc[k][v] : (v16){0};
            transpose16(t);
            for (int c = 0; c < 16; c++)
                memcpy(dxr + (cb + 16 * v + c) * ldx + j, &t[c], NR * sizeof(float));
        }
        return;
    }
#endif
    float buf[NR][VW * NV];
    for (int k = 0; k < NR; k++)
        for (int v = 0; v < NV; v++) memcpy(&buf[k][VW * v], &acc[k][v], sizeof acc[k][v]);
    for (int c = 0; c < VW * NV; c++)
        for (int k = 0; k < NR; k++) dxr[(cb + c) * ldx + (j + k) * os] = buf[k][c];
}

#if VW == 8
/* The block's terms of taps [t0, t1) only, its sums read from and written back to accm (NR x NV vectors in memory):
 * a row's blocks a few taps at a time (dx_row_taps), those taps' weights kept in L1 over the blocks. Each sum takes
 * the same terms in the same order as in NAME, so the same bits. */
static inline void XCONV_CAT(NAME, _taps)(float *accm, const float *dyr, int64_t ldy, const float *w, int64_t ldw,
                                           const int64_t *off, const int64_t *cr, int64_t t0, int64_t t1, int64_t Cog,
                                           int64_t j, int64_t cb) {
    VT acc[NR][NV];
    for (int k = 0; k < NR; k++)
        for (int v = 0; v < NV; v++) acc[k][v] = LOADV(accm + (k * NV + v) * VW);
    for (int64_t t = t0; t < t1; t++) {
        const float *d = dyr + j - off[t];
        const float *wt = w + t * Cog * ldw + cb;
        DX_TAP_RANGE
    }
    for (int k = 0; k < NR; k++)
        for (int v = 0; v < NV; v++) memcpy(accm + (k * NV + v) * VW, &acc[k][v], sizeof acc[k][v]);
}
#endif

#undef DX_TAP_RANGE
#undef NAME
#undef TAPS
#undef NR
#undef NV
#undef VT
#undef VW
#undef LOADV
#undef PRE
