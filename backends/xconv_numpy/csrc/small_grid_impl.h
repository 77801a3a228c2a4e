/* The loops of small_grid.c for one element type T (suffix SUF). */
#define VW ((int64_t)(SG_BYTES / sizeof(T)))
#define OB 8 /* output channels per block */

typedef T XCONV_T(sgvec) __attribute__((vector_size(SG_BYTES)));

static inline XCONV_T(sgvec) XCONV_T(sg_load)(const T *p) { XCONV_T(sgvec) v; memcpy(&v, p, sizeof v); return v; }

/* Returns nonzero when a copied value is not finite (inf or NaN: v - v is not 0). */
static int XCONV_T(xconv_small_fill)(const T *src, T *grid, const int64_t *g) {
    const int64_t N = g[F_N], C = g[F_C], KD = g[F_KD], KH = g[F_KH], KW = g[F_KW];
    const int64_t GH = g[F_GH], GW = g[F_GW], ps = g[F_PS], ldc = g[F_LDC];
    int bad = 0;
    for (int64_t c = 0; c < C; c++) {
        T *chan = grid + c * ldc;
        memset(chan, 0, (size_t)ldc * sizeof(T));
        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < KD; d++)
                for (int64_t h = 0; h < KH; h++) {
                    T *dst = chan + n * ps + ((g[F_AD] + d) * GH + g[F_AH] + h) * GW + g[F_AW];
                    const T *s = src + n * g[F_SN] + c * g[F_SC] + d * g[F_SD] + h * g[F_SH];
                    const int64_t sw = g[F_SW];
                    if (sw == 1)
                        for (int64_t w = 0; w < KW; w++) { dst[w] = s[w]; bad |= s[w] - s[w] != 0; }
                    else
                        for (int64_t w = 0; w < KW; w++) { dst[w] = s[w * sw]; bad |= s[w * sw] - s[w * sw] != 0; }
                }
    }
    memset(grid + C * ldc, 0, (size_t)g[F_TAIL] * sizeof(T));
    return bad;
}

#define SG_LANES 8 /* independent partial sums of the bias gradient */

/* db[o] = sum of dy[n, o, ...] over samples and positions, in double: per (n, o) row of the last dim, element k into
 * lane k % SG_LANES, the lanes added in order at the end (a fixed order). Returns nonzero when a sum is not finite
 * (dy holds an inf or a NaN; for double dy also an overflow, which only sends the call to the exact-zero path).
 * db may be NULL (the check alone). geo as the fill's (N, C = C_out, kept = dy's extents, strides). */
static int XCONV_T(xconv_small_bias)(const T *dy, T *db, const int64_t *g) {
    const int64_t N = g[F_N], C = g[F_C], KD = g[F_KD], KH = g[F_KH], KW = g[F_KW], sw = g[F_SW];
    int bad = 0;
    for (int64_t c = 0; c < C; c++) {
        double lanes[SG_LANES] = {0};
#if SG_AVX512_BIAS
        /* unit-stride rows: the same lanes in one register, element w + k of each row into lane k, a row's last
         * KW % 8 in one masked load whose other lanes add +0 (a lane is never -0: it starts at +0) */
        __m512d acc = _mm512_setzero_pd();
        const __mmask8 tail = (__mmask8)((1u << (KW % SG_LANES)) - 1);
#endif
        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < KD; d++)
                for (int64_t h = 0; h < KH; h++) {
                    const T *s = dy + n * g[F_SN] + c * g[F_SC] + d * g[F_SD] + h * g[F_SH];
                    int64_t w = 0;
#if SG_AVX512_BIAS
                    if (sw == 1) {
                        for (; w + SG_LANES <= KW; w += SG_LANES)
                            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(s + w)));
                        if (tail)
                            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(tail, s + w)));
                        continue;
                    }
#endif
                    for (; w + SG_LANES <= KW; w += SG_LANES)
                        for (int k = 0; k < SG_LANES; k++) lanes[k] += (double)s[(w + k) * sw];
                    for (int k = 0; w < KW; w++, k++) lanes[k] += (double)s[w * sw];
                }
#if SG_AVX512_BIAS
        if (sw == 1)
            _mm512_storeu_pd(lanes, acc);
#endif
        double sum = 0;
        for (int k = 0; k < SG_LANES; k++) sum += lanes[k];
        bad |= sum - sum != 0;
        if (db) db[c] = (T)sum;
    }
    return bad;
}
#undef SG_LANES

static void XCONV_T(xconv_small_corr)(const T *in, const T *w, T *out, const int64_t *off, const int64_t *g) {
    const int64_t N = g[C_N], G = g[C_G], Cig = g[C_CIG], Cog = g[C_COG], K = g[C_K], rows = g[C_ROWS];
    const int64_t ps = g[C_PS], ldi = g[C_LDI], base = g[C_BASE], ldo = g[C_LDO];
    for (int64_t gr = 0; gr < G; gr++)
        for (int64_t ob = 0; ob < Cog; ob += OB) {
            const int64_t nb = Cog - ob < OB ? Cog - ob : OB;
            const T *wb = w + (gr * Cog + ob) * Cig * K;
            for (int64_t n = 0; n < N; n++)
                for (int64_t r = 0; r < rows; r += VW) {
                    XCONV_T(sgvec) acc[OB];
                    for (int o = 0; o < OB; o++) acc[o] = (XCONV_T(sgvec)){0};
                    const T *src0 = in + gr * Cig * ldi + base + n * ps + r;
                    for (int64_t i = 0; i < Cig; i++) {
                        const T *src = src0 + i * ldi;
                        const T *wi = wb + i * K;
                        if (nb == OB)
                            for (int64_t t = 0; t < K; t++) {
                                XCONV_T(sgvec) xv = XCONV_T(sg_load)(src + off[t]);
                                for (int o = 0; o < OB; o++) acc[o] += wi[o * Cig * K + t] * xv;
                            }
                        else if (nb == 4)
                            for (int64_t t = 0; t < K; t++) {
                                XCONV_T(sgvec) xv = XCONV_T(sg_load)(src + off[t]);
                                for (int o = 0; o < 4; o++) acc[o] += wi[o * Cig * K + t] * xv;
                            }
                        else
                            for (int64_t t = 0; t < K; t++) {
                                XCONV_T(sgvec) xv = XCONV_T(sg_load)(src + off[t]);
                                for (int o = 0; o < nb; o++) acc[o] += wi[o * Cig * K + t] * xv;
                            }
                    }
                    const int64_t m = rows - r < VW ? rows - r : VW;
                    for (int o = 0; o < nb; o++) {
                        T *dst = out + (gr * Cog + ob + o) * ldo + n * rows + r;
                        if (m == VW)
                            memcpy(dst, &acc[o], sizeof acc[o]);
                        else
                            for (int64_t k = 0; k < m; k++) dst[k] = acc[o][k];
                    }
                }
        }
}

#define TB 3 /* taps per block of the weight gradient */
#define OBW 4 /* output channels per block of the weight gradient */

/* One (output channel block, tap block) of the weight gradient over positions [0, m) of every sample: NB channels
 * and NT taps known at compile time (the generic block takes nb, tb at run time). A statement macro, not a template
 * (as an always_inline function GCC compiles the caller differently). */
#define SG_DW_BODY(NB, NT)                                                                              \
    for (int64_t n = 0; n < N; n++) {                                                                   \
        const T *s = src0 + n * ps;                                                                     \
        const T *d = dzb + n * pz;                                                                      \
        for (int64_t r = 0; r < rows; r += VW) {                                                        \
            XCONV_T(sgvec) xv[TB], dv[OBW];                                                             \
            if (rows - r >= VW) {                                                                       \
                for (int o = 0; o < (NB); o++) dv[o] = XCONV_T(sg_load)(d + o * ldz + r);               \
            } else {                                                                                    \
                for (int o = 0; o < (NB); o++) {                                                        \
                    dv[o] = (XCONV_T(sgvec)){0};                                                        \
                    for (int64_t k = 0; k < rows - r; k++) dv[o][k] = d[o * ldz + r + k];               \
                }                                                                                       \
            }                                                                                           \
            for (int t = 0; t < (NT); t++) xv[t] = XCONV_T(sg_load)(s + offb[t] + r);                   \
            for (int o = 0; o < (NB); o++)                                                              \
                for (int t = 0; t < (NT); t++) acc[o][t] += dv[o] * xv[t];                              \
        }                                                                                               \
    }

/* dz: dy on a grid of the x grid's plane geometry, channel o's sample n at dz[o * ldz + n * pz], zero wherever no
 * output lies among the first rows positions (the positions past rows are not read). */
static void XCONV_T(xconv_small_dw)(const T *dz, const T *in, T *dw, const int64_t *off, const int64_t *g, const int64_t *zg) {
    const int64_t N = g[C_N], G = g[C_G], Cig = g[C_CIG], Cog = g[C_COG], K = g[C_K], rows = g[C_ROWS];
    const int64_t ps = g[C_PS], ldi = g[C_LDI], base = g[C_BASE], pz = zg[0], ldz = zg[1];
    for (int64_t gr = 0; gr < G; gr++)
        for (int64_t ob = 0; ob < Cog; ob += OBW) {
            const int64_t nb = Cog - ob < OBW ? Cog - ob : OBW;
            const T *dzb = dz + (gr * Cog + ob) * ldz;
            for (int64_t i = 0; i < Cig; i++)
                for (int64_t t0 = 0; t0 < K; t0 += TB) {
                    const int64_t tb = K - t0 < TB ? K - t0 : TB;
                    XCONV_T(sgvec) acc[OBW][TB];
                    int64_t offb[TB];
                    for (int o = 0; o < OBW; o++)
                        for (int t = 0; t < TB; t++) acc[o][t] = (XCONV_T(sgvec)){0};
                    for (int t = 0; t < TB; t++) offb[t] = off[t0 + (t < tb ? t : 0)];
                    const T *src0 = in + (gr * Cig + i) * ldi + base;
                    if (nb == OBW && tb == TB) {
                        SG_DW_BODY(OBW, TB)
                    } else {
                        SG_DW_BODY(nb, tb)
                    }
                    /* each sum its lanes in lane order from 0, the block's OBW x TB sums side by side (one add
                     * after another in each, as before: the same bits; independent chains, not one at a time) */
                    T sum[OBW][TB] = {{0}};
                    for (int64_t k = 0; k < VW; k++)
                        for (int o = 0; o < OBW; o++)
                            for (int t = 0; t < TB; t++) sum[o][t] += acc[o][t][k];
                    for (int o = 0; o < nb; o++)
                        for (int t = 0; t < tb; t++) dw[((gr * Cog + ob + o) * Cig + i) * K + t0 + t] = sum[o][t];
                }
        }
}
#undef SG_DW_BODY

/* out (N, C, *keep) contiguous <- grid: channel c's sample n at grid[c * ldc + n * ps], box keep at the plane's
 * origin in a plane of dims (geo as fill's: N, C, keep, -, grid dims, -, ps, ldc). */
static void XCONV_T(xconv_small_crop)(const T *grid, T *out, const int64_t *g) {
    const int64_t N = g[F_N], C = g[F_C], KD = g[F_KD], KH = g[F_KH], KW = g[F_KW];
    const int64_t GH = g[F_GH], GW = g[F_GW], ps = g[F_PS], ldc = g[F_LDC];
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            const T *plane = grid + c * ldc + n * ps;
            for (int64_t d = 0; d < KD; d++)
                for (int64_t h = 0; h < KH; h++, out += KW)
                    memcpy(out, plane + (d * GH + h) * GW, (size_t)KW * sizeof(T));
        }
}

/* The whole stride-1 small call in one C call: the grids as malloc'd scratch (freed before returning), then the
 * loops above. plan: see small_c.py (_S1Plan); xs, dys: x's and dy's element strides (n, c, d, h, w). Returns 0, 1
 * when scratch could not be allocated (nothing written), or (backward) 2 when an input it reads (dy; x for dW; w for
 * dx) holds an inf or a NaN: the grids multiply padding zeros the definition never multiplies, so the caller runs
 * such a call on the exact-zero path instead (the outputs are then partly written). *scratch (when not NULL) receives
 * the bytes of scratch malloc'd for the call (0 when the allocation failed), for the trace record. */
static int64_t *XCONV_T(sg_fill_geo)(int64_t *g, const int64_t *plan, int64_t C, const int64_t *keep, const int64_t *s,
                                const int64_t *dims, const int64_t *at, int64_t ps, int64_t ldc, int64_t tail) {
    g[F_N] = plan[P_N]; g[F_C] = C;
    for (int k = 0; k < 3; k++) { g[F_KD + k] = keep[k]; g[F_GD + k] = dims[k]; g[F_AD + k] = at[k]; }
    for (int k = 0; k < 5; k++) g[F_SN + k] = s[k];
    g[F_PS] = ps; g[F_LDC] = ldc; g[F_TAIL] = tail;
    return g;
}

int XCONV_T(xconv_small_s1_fprop)(const T *x, const T *w, const T *bias, T *y, const int64_t *plan, const int64_t *xs,
                                  int64_t *scratch) {
    const int64_t N = plan[P_N], C = plan[P_C], Co = plan[P_CO], size = plan[P_XG + 6], rows = plan[P_XG + 7];
    const int64_t ldc = (N + 1) * size;
    T *grid = malloc((size_t)(C * ldc + SG_SLACK) * sizeof(T));
    T *acc = malloc((size_t)(Co * N * rows) * sizeof(T));
    if (scratch) *scratch = 0;
    if (!grid || !acc) { free(grid); free(acc); return 1; }
    if (scratch) *scratch = (int64_t)((C * ldc + SG_SLACK + Co * N * rows) * (int64_t)sizeof(T));
    int64_t fg[F_TAIL + 1], cg[C_LDO + 1];
    XCONV_T(xconv_small_fill)(x, grid, XCONV_T(sg_fill_geo)(fg, plan, C, plan + P_S, xs, plan + P_XG, plan + P_XG + 3, size,
                                                  ldc, SG_SLACK));
    cg[C_N] = N; cg[C_G] = plan[P_G]; cg[C_CIG] = plan[P_CIG]; cg[C_COG] = plan[P_COG]; cg[C_K] = plan[P_K];
    cg[C_ROWS] = rows; cg[C_PS] = size; cg[C_LDI] = ldc; cg[C_BASE] = 0; cg[C_LDO] = N * rows;
    XCONV_T(xconv_small_corr)(grid, w, acc, plan + P_OFF, cg);
    if (bias)
        for (int64_t o = 0; o < Co; o++)
            for (int64_t k = 0; k < N * rows; k++) acc[o * N * rows + k] += bias[o];
    static const int64_t zero5[5] = {0};
    XCONV_T(xconv_small_crop)(acc, y, XCONV_T(sg_fill_geo)(fg, plan, Co, plan + P_O, zero5, plan + P_YCROP, zero5, rows,
                                                 N * rows, 0));
    free(grid);
    free(acc);
    return 0;
}

int XCONV_T(xconv_small_s1_backward)(const T *dy, const T *x, const T *w, T *dx, T *dw, T *db, const int64_t *plan,
                                const int64_t *dys, const int64_t *xs, int64_t *scratch) {
    const int64_t N = plan[P_N], C = plan[P_C], Co = plan[P_CO], G = plan[P_G], Cig = plan[P_CIG];
    const int64_t Cog = plan[P_COG], K = plan[P_K];
    const int64_t xsize = plan[P_XG + 6], xrows = plan[P_XG + 7], xldc = (N + 1) * xsize;
    const int64_t dsize = plan[P_DG + 6], drows = plan[P_DG + 7], dldc = (N + 1) * dsize;
    const int dz_from_grid = plan[P_DZ] != 0;
    const int need_dygrid = dx != NULL || (dw != NULL && dz_from_grid);
    static const int64_t zero5[5] = {0};
    int64_t fg[F_TAIL + 1], cg[C_LDO + 1], zg[2];
    T *dgrid = need_dygrid ? malloc((size_t)(Co * dldc + SG_SLACK) * sizeof(T)) : NULL;
    T *xgrid = dw ? malloc((size_t)(C * xldc + SG_SLACK) * sizeof(T)) : NULL;
    T *dz = dw && !dz_from_grid ? malloc((size_t)(Co * N * xrows + SG_SLACK) * sizeof(T)) : NULL;
    T *acc = dx ? malloc((size_t)(C * N * drows) * sizeof(T)) : NULL;
    T *wt = dx ? malloc((size_t)(C * Cog * K) * sizeof(T)) : NULL;
    if (scratch) *scratch = 0;
    if ((need_dygrid && !dgrid) || (dw && !xgrid) || (dw && !dz_from_grid && !dz) || (dx && (!acc || !wt))) {
        free(dgrid); free(xgrid); free(dz); free(acc); free(wt);
        return 1;
    }
    if (scratch)
        *scratch = (int64_t)sizeof(T) * ((need_dygrid ? Co * dldc + SG_SLACK : 0) + (dw ? C * xldc + SG_SLACK : 0)
                                         + (dw && !dz_from_grid ? Co * N * xrows + SG_SLACK : 0)
                                         + (dx ? C * N * drows + C * Cog * K : 0));
    int bad = XCONV_T(xconv_small_bias)(dy, db, XCONV_T(sg_fill_geo)(fg, plan, Co, plan + P_O, dys, zero5, zero5, 0, 0, 0));
    if (need_dygrid)
        XCONV_T(xconv_small_fill)(dy, dgrid, XCONV_T(sg_fill_geo)(fg, plan, Co, plan + P_KEEP, dys, plan + P_DG, plan + P_DG + 3,
                                                        dsize, dldc, SG_SLACK));
    cg[C_N] = N; cg[C_G] = G; cg[C_K] = K;
    if (dw) {
        bad |= XCONV_T(xconv_small_fill)(x, xgrid, XCONV_T(sg_fill_geo)(fg, plan, C, plan + P_S, xs, plan + P_XG, plan + P_XG + 3,
                                                       xsize, xldc, SG_SLACK));
        const T *dzp;
        if (dz_from_grid) {
            dzp = dgrid + plan[P_CORNER]; zg[0] = dsize; zg[1] = dldc;
        } else {
            XCONV_T(xconv_small_fill)(dy, dz, XCONV_T(sg_fill_geo)(fg, plan, Co, plan + P_O, dys, plan + P_YCROP, zero5, xrows,
                                                         N * xrows, SG_SLACK));
            dzp = dz; zg[0] = xrows; zg[1] = N * xrows;
        }
        cg[C_CIG] = Cig; cg[C_COG] = Cog; cg[C_ROWS] = xrows; cg[C_PS] = xsize; cg[C_LDI] = xldc; cg[C_BASE] = 0;
        cg[C_LDO] = 0;
        XCONV_T(xconv_small_dw)(dzp, xgrid, dw, plan + P_OFF, cg, zg);
    }
    if (dx) {
        /* the weights per group transposed (C/g x C_out/g) and their taps reversed */
        for (int64_t gr = 0; gr < G; gr++)
            for (int64_t o = 0; o < Cog; o++)
                for (int64_t i = 0; i < Cig; i++)
                    for (int64_t t = 0; t < K; t++) {
                        const T v = w[((gr * Cog + o) * Cig + i) * K + t];
                        wt[((gr * Cig + i) * Cog + o) * K + (K - 1 - t)] = v;
                        bad |= v - v != 0;
                    }
        cg[C_CIG] = Cog; cg[C_COG] = Cig; cg[C_ROWS] = drows; cg[C_PS] = dsize; cg[C_LDI] = dldc;
        cg[C_BASE] = plan[P_DBASE]; cg[C_LDO] = N * drows;
        XCONV_T(xconv_small_corr)(dgrid, wt, acc, plan + P_OFF + K, cg);
        XCONV_T(xconv_small_crop)(acc, dx, XCONV_T(sg_fill_geo)(fg, plan, C, plan + P_S, zero5, plan + P_XCROP, zero5, drows,
                                                      N * drows, 0));
    }
    free(dgrid); free(xgrid); free(dz); free(acc); free(wt);
    return bad ? 2 : 0;
}

#undef OB
#undef OBW
#undef TB
#undef VW
