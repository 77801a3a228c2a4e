/* Depthwise convolution loops of one element type (see depthwise.c, which includes this file once per type with
 * T the element type and SUF its suffix). Everything here is static except the two entry points. */

#define DW_VL ((int)(32 / sizeof(T)))

typedef T XCONV_T(vec) __attribute__((vector_size(32)));
#define DW_V XCONV_T(vec)
typedef TI XCONV_T(ivec) __attribute__((vector_size(32)));   /* shuffle masks (TI: integers of T's width) */
#define DW_IV XCONV_T(ivec)

static inline DW_V XCONV_T(vload)(const T *p) { DW_V v; memcpy(&v, p, sizeof v); return v; }

/* The sum of a vector's lanes, in a fixed tree (halves added pairwise). */
static inline T XCONV_T(hsum)(DW_V v) {
    T l[DW_VL];
    memcpy(l, &v, sizeof v);
    for (int w = DW_VL / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}

/* The sum of g[0..n), lanes then tail, in a fixed order. */
static T XCONV_T(sum)(const T *g, int64_t n) {
    DW_V acc = {0};
    T tail = 0;
    int64_t i = 0;
    for (; i + DW_VL <= n; i += DW_VL) acc += XCONV_T(vload)(g + i);
    for (; i < n; i++) tail += g[i];
    return XCONV_T(hsum)(acc) + tail;
}

/* out[k] = sum over oh < OH, ow < OW of g[oh * Lw + ow] * src[k][oh * Lw + ow], k < CNT (only positions of the
 * OH x OW box are read). */
static inline __attribute__((always_inline)) void XCONV_T(dots)(const T *g, int64_t OH, int64_t OW,
                                                                 const T *const *src, int64_t Lw, int CNT, T *out) {
    DW_V acc[8];
    T tail[8];
    for (int k = 0; k < CNT; k++) {
        acc[k] = (DW_V){0};
        tail[k] = 0;
    }
    for (int64_t oh = 0; oh < OH; oh++) {
        const T *gr = g + oh * Lw;
        int64_t ow = 0;
        for (; ow + DW_VL <= OW; ow += DW_VL) {
            DW_V gv = XCONV_T(vload)(gr + ow);
            for (int k = 0; k < CNT; k++) acc[k] += gv * XCONV_T(vload)(src[k] + oh * Lw + ow);
        }
        for (; ow < OW; ow++)
            for (int k = 0; k < CNT; k++) tail[k] += gr[ow] * src[k][oh * Lw + ow];
    }
    for (int k = 0; k < CNT; k++) out[k] = XCONV_T(hsum)(acc[k]) + tail[k];
}

static void XCONV_T(dots_any)(const T *g, int64_t OH, int64_t OW, const T *const *src, int64_t Lw, int cnt,
                               T *out) {
    switch (cnt) {
    case 8: XCONV_T(dots)(g, OH, OW, src, Lw, 8, out); break;
    case 7: XCONV_T(dots)(g, OH, OW, src, Lw, 7, out); break;
    case 6: XCONV_T(dots)(g, OH, OW, src, Lw, 6, out); break;
    case 5: XCONV_T(dots)(g, OH, OW, src, Lw, 5, out); break;
    case 4: XCONV_T(dots)(g, OH, OW, src, Lw, 4, out); break;
    case 3: XCONV_T(dots)(g, OH, OW, src, Lw, 3, out); break;
    case 2: XCONV_T(dots)(g, OH, OW, src, Lw, 2, out); break;
    default: XCONV_T(dots)(g, OH, OW, src, Lw, 1, out); break;
    }
}

/* dst[i] += a[0] * s[0][i] + ... + a[CNT-1] * s[CNT-1][i] for i < n (terms in order). */
static inline __attribute__((always_inline)) void XCONV_T(axpys)(T *restrict dst, const T *const *s, const T *a,
                                                                  int64_t n, int CNT) {
    const T *restrict p[8];
    T c[8];
    for (int k = 0; k < CNT; k++) {
        p[k] = s[k];
        c[k] = a[k];
    }
    for (int64_t i = 0; i < n; i++) {
        T t = c[0] * p[0][i];
        for (int k = 1; k < CNT; k++) t += c[k] * p[k][i];
        dst[i] += t;
    }
}

/* axpys_ with a count known at run time (1..8). */
static void XCONV_T(axpys_any)(T *dst, const T *const *s, const T *a, int64_t n, int cnt) {
    switch (cnt) {
    case 8: XCONV_T(axpys)(dst, s, a, n, 8); break;
    case 7: XCONV_T(axpys)(dst, s, a, n, 7); break;
    case 6: XCONV_T(axpys)(dst, s, a, n, 6); break;
    case 5: XCONV_T(axpys)(dst, s, a, n, 5); break;
    case 4: XCONV_T(axpys)(dst, s, a, n, 4); break;
    case 3: XCONV_T(axpys)(dst, s, a, n, 3); break;
    case 2: XCONV_T(axpys)(dst, s, a, n, 2); break;
    default: XCONV_T(axpys)(dst, s, a, n, 1); break;
    }
}

/* A chunk of cnt (1..8) taps adding into dst (a row of the phase grid): tap k reads src[k][b - lo[k]] for
 * lo[k] <= b < lo[k] + len and nothing elsewhere (no term for positions a tap does not reach: no Inf meets a
 * zero). Columns every tap reaches run vectorized, the edges one by one with the terms in the same order. */
static void XCONV_T(chunk)(T *dst, const T *const *src, const int64_t *lo, const T *a, int cnt, int64_t len) {
    int64_t l0 = lo[0], l1 = lo[0];
    for (int k = 1; k < cnt; k++) {
        l0 = lo[k] < l0 ? lo[k] : l0;
        l1 = lo[k] > l1 ? lo[k] : l1;
    }
    int64_t in0 = l1, in1 = l0 + len;                    /* columns every tap reaches: [in0, in1) */
    if (in1 < in0) in1 = in0;
    int64_t e_end = l1 + len;                            /* columns some tap reaches: [l0, e_end) */
    for (int64_t b = l0; b < e_end; b++) {
        if (b == in0 && in1 > in0) {
            const T *s[8];
            for (int k = 0; k < cnt; k++) s[k] = src[k] + (in0 - lo[k]);
            XCONV_T(axpys_any)(dst + in0, s, a, in1 - in0, cnt);
            b = in1 - 1;
            continue;
        }
        T t = 0;
        int any = 0;
        for (int k = 0; k < cnt; k++)
            if (b >= lo[k] && b < lo[k] + len) {
                t = any ? t + a[k] * src[k][b - lo[k]] : a[k] * src[k][b - lo[k]];
                any = 1;
            }
        if (any) dst[b] += t;
    }
}

/* x plane (H, W; element strides sy, sz) into the phases of its zero-padded grid: phase slot s at xph + s * LP
 * (LP >= Lh * Lw). Input row y lies in row rowa[y] of row slot rows[y] (-1: no tap reads that row phase); column
 * slot j holds the columns z = z0 + k * sw (k < cnt) at b0 + k, (z0, b0, cnt) = runs[3j..3j+2]. Returns whether
 * every value copied is finite. */
static int XCONV_T(to_phases)(const T *x, int64_t sy, int64_t sz, int64_t H, const int64_t *tab,
                               const int64_t *runs, int64_t sw, int64_t nRw, int64_t nslots, int64_t LP,
                               int64_t Lw, T *xph) {
    const int64_t *rows = tab, *rowa = tab + H;
    DW_V chk = {0};
    T tchk = 0;
    memset(xph, 0, nslots * LP * sizeof(T));
    for (int64_t y = 0; y < H; y++) {
        if (rows[y] < 0) continue;
        T *base = xph + rows[y] * nRw * LP + rowa[y] * Lw;
        const T *xr = x + y * sy;
        for (int64_t j = 0; j < nRw; j++) {
            const int64_t *r = runs + 3 * j;
            T *d = base + j * LP + r[1];
            const T *src = xr + r[0] * sz;
            int64_t step = sw * sz, k = 0;
            if (step == 1)                                  /* v * 0 is NaN exactly when v is not finite */
                for (; k + DW_VL <= r[2]; k += DW_VL) {
                    DW_V v = XCONV_T(vload)(src + k);
                    memcpy(d + k, &v, sizeof v);
                    chk += v * 0;
                }
#if defined(__GNUC__) && !defined(__clang__)
            else if (step == 2) {                           /* the even lanes of two vectors (reads stay in the run:
                                                             * its last pair is left to the loops below) */
                DW_IV even;
                for (int l = 0; l < DW_VL; l++) even[l] = 2 * l;
                for (; k + DW_VL < r[2]; k += DW_VL) {
                    DW_V v = __builtin_shuffle(XCONV_T(vload)(src + 2 * k), XCONV_T(vload)(src + 2 * k + DW_VL), even);
                    memcpy(d + k, &v, sizeof v);
                    chk += v * 0;
                }
            }
#endif
            if (step != 1)                                  /* strided: gathered a vector at a time (the check in
                                                             * vector lanes, not one serial chain of adds) */
                for (; k + DW_VL <= r[2]; k += DW_VL) {
                    DW_V v;
                    for (int l = 0; l < DW_VL; l++) v[l] = src[(k + l) * step];
                    memcpy(d + k, &v, sizeof v);
                    chk += v * 0;
                }
            for (; k < r[2]; k++) {
                d[k] = src[k * step];
                tchk += d[k] * 0;
            }
        }
    }
    return XCONV_T(hsum)(chk) + tchk == 0;
}

/* The inverse of to_phases_ into a C-contiguous (H, W) plane: zeros where no tap reaches. */
static void XCONV_T(from_phases)(const T *acc, const int64_t *tab, const int64_t *runs, int64_t sw, int64_t H,
                                  int64_t W, int64_t nRw, int64_t LP, int64_t Lw, T *dx) {
    const int64_t *rows = tab, *rowa = tab + H;
    int64_t covered = 0;
    for (int64_t j = 0; j < nRw; j++) covered += runs[3 * j + 2];
    for (int64_t y = 0; y < H; y++) {
        T *d = dx + y * W;
        if (rows[y] < 0 || covered < W) memset(d, 0, W * sizeof(T));
        if (rows[y] < 0) continue;
        const T *base = acc + rows[y] * nRw * LP + rowa[y] * Lw;
        for (int64_t j = 0; j < nRw; j++) {
            const int64_t *r = runs + 3 * j;
            const T *src = base + j * LP + r[1];
            if (sw == 1)
                memcpy(d + r[0], src, r[2] * sizeof(T));
            else
                for (int64_t k = 0; k < r[2]; k++) d[r[0] + k * sw] = src[k];
        }
    }
}

/* Planes [p0, p1) (flat n * C + c over input channels) of a depthwise backward. dy (N, C*m, OH, OW) and x (N, C,
 * H, W) at any element strides (geo); w (C*m, K) and dx (N, C, H, W) C-contiguous; dwp (N, C*m, K) receives each
 * sample's weight-gradient partial, dbp (N, C*m) each sample's bias-gradient partial. taps (K rows of tap, qh, qw,
 * slot: tap t of the kernel reads row a = oh + qh, column b = ow + qw of phase slot, flat offset
 * off = qh * Lw + qw), sorted by slot; tab the phase tables of to_phases_. Scratch: g (F + (Lh + 1) * Lw, F the
 * largest offset), xph and acc (nslots * (Lh + 1) * Lw each).
 *
 * Two forms of the same sums. Flat: over the phase grid's rows of Lw (dy placed on it, zeros around), one long
 * vector loop per group of taps; its extra terms multiply grid zeros, which is exact for finite factors: used for
 * dx when the weights are finite (geo flag) and for dw when the x plane is. Otherwise by rows, with only the
 * (tap, position) pairs that exist. */
void XCONV_T(xconv_depthwise_backward)(const T *dy, const T *x, const T *w, T *dx, T *dwp, T *dbp,
                                        const int64_t *geo, const int64_t *taps, const int64_t *tab, T *g, T *xph,
                                        T *acc, int64_t p0, int64_t p1) {
    int64_t C = geo[G_C], m = geo[G_M], H = geo[G_H], W = geo[G_W], OH = geo[G_OH], OW = geo[G_OW];
    int64_t Lh = geo[G_LH], Lw = geo[G_LW], K = geo[G_K], nRw = geo[G_NRW], nslots = geo[G_NSLOTS];
    int64_t LP = (Lh + 1) * Lw, F = geo[G_F];
    int need_dx = (int)geo[G_DX], need_dw = (int)geo[G_DW], need_db = (int)geo[G_DB];
    int flat_dx = need_dx && geo[G_FLATDX];
    const int64_t *xs = geo + G_XS, *ds = geo + G_DYS, *runs = tab + 2 * H;
    int64_t Co = C * m, sw = geo[G_SW];
    T *gpad = g + F;                                        /* dy on the grid, F zeros before it */
    for (int64_t pi = p0; pi < p1; pi++) {
        int64_t n = pi / C, c = pi - n * C;
        int flat_dw = 0;
        if (need_dw)
            flat_dw = XCONV_T(to_phases)(x + n * xs[0] + c * xs[1], xs[2], xs[3], H, tab, runs, sw, nRw, nslots,
                                          LP, Lw, xph);
        if (need_dx) memset(acc, 0, nslots * LP * sizeof(T));
        for (int64_t mo = 0; mo < m; mo++) {
            int64_t co = c * m + mo;
            const T *dyp = dy + n * ds[0] + co * ds[1];
            memset(g, 0, (F + LP) * sizeof(T));
            for (int64_t oh = 0; oh < OH; oh++) {
                T *d = gpad + oh * Lw;
                if (ds[3] == 1)
                    memcpy(d, dyp + oh * ds[2], OW * sizeof(T));
                else
                    for (int64_t ow = 0; ow < OW; ow++) d[ow] = dyp[oh * ds[2] + ow * ds[3]];
            }
            if (need_db) dbp[n * Co + co] = XCONV_T(sum)(gpad, OH * Lw);   /* the grid's zeros add nothing */
            if (need_dw) {
                for (int64_t k0 = 0; k0 < K; k0 += 8) {
                    int cnt = K - k0 < 8 ? (int)(K - k0) : 8;
                    const T *src[8];
                    T out[8];
                    for (int k = 0; k < cnt; k++) {
                        const int64_t *tp = taps + 4 * (k0 + k);
                        src[k] = xph + tp[3] * LP + tp[1] * Lw + tp[2];
                    }
                    if (flat_dw)
                        XCONV_T(dots_any)(gpad, 1, OH * Lw, src, 0, cnt, out);
                    else
                        XCONV_T(dots_any)(gpad, OH, OW, src, Lw, cnt, out);
                    for (int k = 0; k < cnt; k++) dwp[(n * Co + co) * K + taps[4 * (k0 + k)]] = out[k];
                }
            }
            if (need_dx) {
                /* per phase slot: its taps, in chunks of 8 over the whole phase (flat) or per row of it */
                for (int64_t k0 = 0; k0 < K;) {
                    int64_t slot = taps[4 * k0 + 3], k1 = k0;
                    while (k1 < K && taps[4 * k1 + 3] == slot) k1++;
                    if (flat_dx) {
                        for (int64_t kc = k0; kc < k1; kc += 8) {
                            int cnt = k1 - kc < 8 ? (int)(k1 - kc) : 8;
                            const T *src[8];
                            T wt[8];
                            for (int k = 0; k < cnt; k++) {
                                const int64_t *tp = taps + 4 * (kc + k);
                                src[k] = gpad - (tp[1] * Lw + tp[2]);
                                wt[k] = w[co * K + tp[0]];
                            }
                            XCONV_T(axpys_any)(acc + slot * LP, src, wt, Lh * Lw, cnt);
                        }
                        k0 = k1;
                        continue;
                    }
                    for (int64_t a = 0; a < Lh; a++) {
                        const T *src[8];
                        int64_t lo[8];
                        T wt[8];
                        int cnt = 0;
                        for (int64_t k = k0; k < k1; k++) {
                            const int64_t *tp = taps + 4 * k;
                            int64_t oh = a - tp[1];
                            if (oh < 0 || oh >= OH) continue;
                            src[cnt] = gpad + oh * Lw;
                            lo[cnt] = tp[2];
                            wt[cnt] = w[co * K + tp[0]];
                            if (++cnt == 8) {
                                XCONV_T(chunk)(acc + slot * LP + a * Lw, src, lo, wt, cnt, OW);
                                cnt = 0;
                            }
                        }
                        if (cnt) XCONV_T(chunk)(acc + slot * LP + a * Lw, src, lo, wt, cnt, OW);
                    }
                    k0 = k1;
                }
            }
        }
        if (need_dx) XCONV_T(from_phases)(acc, tab, runs, sw, H, W, nRw, LP, Lw, dx + (n * C + c) * H * W);
    }
}

/* Planes [p0, p1) of a depthwise forward into y (N, C*m, OH, OW), C-contiguous; x at any element strides (geo);
 * scratch g and xph as for the backward. y on the grid (rows of Lw: the extra columns are dropped) = sum over
 * taps (in the order of taps, groups of 8) of w * the phase at the tap's offset. */
void XCONV_T(xconv_depthwise_fprop)(const T *x, const T *w, T *y, const int64_t *geo, const int64_t *taps,
                                     const int64_t *tab, T *g, T *xph, int64_t p0, int64_t p1) {
    int64_t C = geo[G_C], m = geo[G_M], H = geo[G_H], OH = geo[G_OH], OW = geo[G_OW];
    int64_t Lw = geo[G_LW], K = geo[G_K], nRw = geo[G_NRW], nslots = geo[G_NSLOTS], LP = (geo[G_LH] + 1) * Lw;
    const int64_t *xs = geo + G_XS, *runs = tab + 2 * H;
    int64_t sw = geo[G_SW];
    for (int64_t pi = p0; pi < p1; pi++) {
        int64_t n = pi / C, c = pi - n * C;
        XCONV_T(to_phases)(x + n * xs[0] + c * xs[1], xs[2], xs[3], H, tab, runs, sw, nRw, nslots, LP, Lw, xph);
        for (int64_t mo = 0; mo < m; mo++) {
            int64_t co = c * m + mo;
            memset(g, 0, OH * Lw * sizeof(T));
            for (int64_t k0 = 0; k0 < K; k0 += 8) {
                int cnt = K - k0 < 8 ? (int)(K - k0) : 8;
                const T *src[8];
                T wt[8];
                for (int k = 0; k < cnt; k++) {
                    const int64_t *tp = taps + 4 * (k0 + k);
                    src[k] = xph + tp[3] * LP + tp[1] * Lw + tp[2];
                    wt[k] = w[co * K + tp[0]];
                }
                XCONV_T(axpys_any)(g, src, wt, OH * Lw, cnt);
            }
            T *yp = y + (n * C * m + co) * OH * OW;
            for (int64_t oh = 0; oh < OH; oh++) memcpy(yp + oh * OW, g + oh * Lw, OW * sizeof(T));
        }
    }
}

#undef DW_V
#undef DW_IV
#undef DW_VL
