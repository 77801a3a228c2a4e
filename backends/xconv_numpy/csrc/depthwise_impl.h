/* Depthwise convolution loops of one element type (see depthwise.c, which includes this file once per type with
 * T the element type and SUF its suffix). Everything here is static except the two entry points. */

#define DW_CAT_(a, b) a##b
#define DW_CAT(a, b) DW_CAT_(a, b)
#define DW_NAME(name) DW_CAT(name, SUF)
#define DW_VL ((int)(32 / sizeof(T)))

typedef T DW_NAME(vec_) __attribute__((vector_size(32)));
#define DW_V DW_NAME(vec_)

static inline DW_V DW_NAME(vload_)(const T *p) { DW_V v; memcpy(&v, p, sizeof v); return v; }

/* The sum of a vector's lanes, in a fixed tree (halves added pairwise). */
static inline T DW_NAME(hsum_)(DW_V v) {
    T l[DW_VL];
    memcpy(l, &v, sizeof v);
    for (int w = DW_VL / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}

/* The sum of g[0..n), lanes then tail, in a fixed order. */
static T DW_NAME(sum_)(const T *g, int64_t n) {
    DW_V acc = {0};
    T tail = 0;
    int64_t i = 0;
    for (; i + DW_VL <= n; i += DW_VL) acc += DW_NAME(vload_)(g + i);
    for (; i < n; i++) tail += g[i];
    return DW_NAME(hsum_)(acc) + tail;
}

/* out[k] = sum over oh < OH, ow < OW of g[oh * OW + ow] * src[k][oh * Lw + ow], k < CNT (only valid positions:
 * nothing outside the OH x OW box is read). */
static inline __attribute__((always_inline)) void DW_NAME(dots_)(const T *g, int64_t OH, int64_t OW,
                                                                 const T *const *src, int64_t Lw, int CNT, T *out) {
    DW_V acc[4] = {{0}, {0}, {0}, {0}};
    T tail[4] = {0, 0, 0, 0};
    for (int64_t oh = 0; oh < OH; oh++) {
        const T *gr = g + oh * OW;
        int64_t ow = 0;
        for (; ow + DW_VL <= OW; ow += DW_VL) {
            DW_V gv = DW_NAME(vload_)(gr + ow);
            for (int k = 0; k < CNT; k++) acc[k] += gv * DW_NAME(vload_)(src[k] + oh * Lw + ow);
        }
        for (; ow < OW; ow++)
            for (int k = 0; k < CNT; k++) tail[k] += gr[ow] * src[k][oh * Lw + ow];
    }
    for (int k = 0; k < CNT; k++) out[k] = DW_NAME(hsum_)(acc[k]) + tail[k];
}

static void DW_NAME(dots_any_)(const T *g, int64_t OH, int64_t OW, const T *const *src, int64_t Lw, int cnt,
                               T *out) {
    switch (cnt) {
    case 4: DW_NAME(dots_)(g, OH, OW, src, Lw, 4, out); break;
    case 3: DW_NAME(dots_)(g, OH, OW, src, Lw, 3, out); break;
    case 2: DW_NAME(dots_)(g, OH, OW, src, Lw, 2, out); break;
    default: DW_NAME(dots_)(g, OH, OW, src, Lw, 1, out); break;
    }
}

/* dst[i] += a[0] * s[0][i] + ... + a[CNT-1] * s[CNT-1][i] for i < n (terms in order). */
static inline __attribute__((always_inline)) void DW_NAME(axpys_)(T *restrict dst, const T *const *s, const T *a,
                                                                  int64_t n, int CNT) {
    const T *s0 = s[0], *s1 = s[CNT > 1 ? 1 : 0], *s2 = s[CNT > 2 ? 2 : 0], *s3 = s[CNT > 3 ? 3 : 0];
    T a0 = a[0], a1 = CNT > 1 ? a[1] : 0, a2 = CNT > 2 ? a[2] : 0, a3 = CNT > 3 ? a[3] : 0;
    if (CNT == 4)
        for (int64_t i = 0; i < n; i++) dst[i] += a0 * s0[i] + a1 * s1[i] + a2 * s2[i] + a3 * s3[i];
    else if (CNT == 3)
        for (int64_t i = 0; i < n; i++) dst[i] += a0 * s0[i] + a1 * s1[i] + a2 * s2[i];
    else if (CNT == 2)
        for (int64_t i = 0; i < n; i++) dst[i] += a0 * s0[i] + a1 * s1[i];
    else
        for (int64_t i = 0; i < n; i++) dst[i] += a0 * s0[i];
}

/* A chunk of cnt (1..4) taps adding into dst (a row of the phase grid): tap k reads src[k][b - lo[k]] for
 * lo[k] <= b < lo[k] + len and nothing elsewhere (no term for positions a tap does not reach: no Inf meets a
 * zero). Columns every tap reaches run vectorized, the edges one by one with the terms in the same order. */
static void DW_NAME(chunk_)(T *dst, const T *const *src, const int64_t *lo, const T *a, int cnt, int64_t len) {
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
            const T *s[4];
            for (int k = 0; k < cnt; k++) s[k] = src[k] + (in0 - lo[k]);
            switch (cnt) {
            case 4: DW_NAME(axpys_)(dst + in0, s, a, in1 - in0, 4); break;
            case 3: DW_NAME(axpys_)(dst + in0, s, a, in1 - in0, 3); break;
            case 2: DW_NAME(axpys_)(dst + in0, s, a, in1 - in0, 2); break;
            default: DW_NAME(axpys_)(dst + in0, s, a, in1 - in0, 1); break;
            }
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

/* x plane (H, W; element strides sh_, sw_) into the phases of its zero-padded grid: phase slot s at xph + s * LL
 * (LL = Lh * Lw), input (y, z) at row rowa[y], column colb[z] of slot rows[y] * nRw + cols[z] (skipped where a
 * table holds -1: no tap reads that phase). */
static void DW_NAME(to_phases_)(const T *x, int64_t sy, int64_t sz, int64_t H, int64_t W, const int64_t *tab,
                                int64_t nRw, int64_t nslots, int64_t LL, int64_t Lw, T *xph) {
    const int64_t *rows = tab, *rowa = tab + H, *cols = tab + 2 * H, *colb = tab + 2 * H + W;
    memset(xph, 0, nslots * LL * sizeof(T));
    for (int64_t y = 0; y < H; y++) {
        if (rows[y] < 0) continue;
        T *base = xph + rows[y] * nRw * LL + rowa[y] * Lw;
        const T *xr = x + y * sy;
        for (int64_t z = 0; z < W; z++)
            if (cols[z] >= 0) base[cols[z] * LL + colb[z]] = xr[z * sz];
    }
}

/* The inverse of to_phases_ into a C-contiguous (H, W) plane: zeros for phases no tap reaches. */
static void DW_NAME(from_phases_)(const T *acc, const int64_t *tab, int64_t H, int64_t W, int64_t nRw, int64_t LL,
                                  int64_t Lw, T *dx) {
    const int64_t *rows = tab, *rowa = tab + H, *cols = tab + 2 * H, *colb = tab + 2 * H + W;
    for (int64_t y = 0; y < H; y++) {
        T *d = dx + y * W;
        if (rows[y] < 0) {
            memset(d, 0, W * sizeof(T));
            continue;
        }
        const T *base = acc + rows[y] * nRw * LL + rowa[y] * Lw;
        for (int64_t z = 0; z < W; z++) d[z] = cols[z] >= 0 ? base[cols[z] * LL + colb[z]] : 0;
    }
}

/* Planes [p0, p1) (flat n * C + c over input channels) of a depthwise backward. dy (N, C*m, OH, OW) and x (N, C,
 * H, W) at any element strides (geo); w (C*m, K) and dx (N, C, H, W) C-contiguous; dwp (N, C*m, K) receives each
 * sample's weight-gradient partial, dbp (N, C*m) each sample's bias-gradient partial. taps (K rows of tap, qh, qw,
 * slot: tap t of the kernel reads row a = oh + qh, column b = ow + qw of phase slot), sorted by slot; tab the
 * phase tables of to_phases_. Scratch: g (OH*OW), xph and acc (nslots * Lh * Lw each). */
void DW_NAME(xconv_depthwise_backward_)(const T *dy, const T *x, const T *w, T *dx, T *dwp, T *dbp,
                                        const int64_t *geo, const int64_t *taps, const int64_t *tab, T *g, T *xph,
                                        T *acc, int64_t p0, int64_t p1) {
    int64_t C = geo[G_C], m = geo[G_M], H = geo[G_H], W = geo[G_W], OH = geo[G_OH], OW = geo[G_OW];
    int64_t Lh = geo[G_LH], Lw = geo[G_LW], K = geo[G_K], nRw = geo[G_NRW], nslots = geo[G_NSLOTS], LL = Lh * Lw;
    int need_dx = (int)geo[G_DX], need_dw = (int)geo[G_DW], need_db = (int)geo[G_DB];
    const int64_t *xs = geo + G_XS, *ds = geo + G_DYS;
    int64_t Co = C * m;
    for (int64_t pi = p0; pi < p1; pi++) {
        int64_t n = pi / C, c = pi - n * C;
        if (need_dw) DW_NAME(to_phases_)(x + n * xs[0] + c * xs[1], xs[2], xs[3], H, W, tab, nRw, nslots, LL, Lw, xph);
        if (need_dx) memset(acc, 0, nslots * LL * sizeof(T));
        for (int64_t mo = 0; mo < m; mo++) {
            int64_t co = c * m + mo;
            const T *dyp = dy + n * ds[0] + co * ds[1];
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) g[oh * OW + ow] = dyp[oh * ds[2] + ow * ds[3]];
            if (need_db) dbp[n * Co + co] = DW_NAME(sum_)(g, OH * OW);
            if (need_dw) {
                for (int64_t k0 = 0; k0 < K; k0 += 4) {
                    int cnt = K - k0 < 4 ? (int)(K - k0) : 4;
                    const T *src[4];
                    T out[4];
                    for (int k = 0; k < cnt; k++) {
                        const int64_t *tp = taps + 4 * (k0 + k);
                        src[k] = xph + tp[3] * LL + tp[1] * Lw + tp[2];
                    }
                    DW_NAME(dots_any_)(g, OH, OW, src, Lw, cnt, out);
                    for (int k = 0; k < cnt; k++) dwp[(n * Co + co) * K + taps[4 * (k0 + k)]] = out[k];
                }
            }
            if (need_dx) {
                /* per phase slot and row of it: the taps of that slot reaching the row, in chunks of 4 */
                for (int64_t k0 = 0; k0 < K;) {
                    int64_t slot = taps[4 * k0 + 3], k1 = k0;
                    while (k1 < K && taps[4 * k1 + 3] == slot) k1++;
                    for (int64_t a = 0; a < Lh; a++) {
                        const T *src[4];
                        int64_t lo[4];
                        T wt[4];
                        int cnt = 0;
                        for (int64_t k = k0; k < k1; k++) {
                            const int64_t *tp = taps + 4 * k;
                            int64_t oh = a - tp[1];
                            if (oh < 0 || oh >= OH) continue;
                            src[cnt] = g + oh * OW;
                            lo[cnt] = tp[2];
                            wt[cnt] = w[co * K + tp[0]];
                            if (++cnt == 4) {
                                DW_NAME(chunk_)(acc + slot * LL + a * Lw, src, lo, wt, cnt, OW);
                                cnt = 0;
                            }
                        }
                        if (cnt) DW_NAME(chunk_)(acc + slot * LL + a * Lw, src, lo, wt, cnt, OW);
                    }
                    k0 = k1;
                }
            }
        }
        if (need_dx) DW_NAME(from_phases_)(acc, tab, H, W, nRw, LL, Lw, dx + (n * C + c) * H * W);
    }
}

/* Planes [p0, p1) of a depthwise forward into y (N, C*m, OH, OW), C-contiguous; x at any element strides (geo);
 * scratch xph as for the backward. y[oh, ow] = sum over taps (in the order of taps) of w * x_phase. */
void DW_NAME(xconv_depthwise_fprop_)(const T *x, const T *w, T *y, const int64_t *geo, const int64_t *taps,
                                     const int64_t *tab, T *xph, int64_t p0, int64_t p1) {
    int64_t C = geo[G_C], m = geo[G_M], H = geo[G_H], W = geo[G_W], OH = geo[G_OH], OW = geo[G_OW];
    int64_t Lw = geo[G_LW], K = geo[G_K], nRw = geo[G_NRW], nslots = geo[G_NSLOTS], LL = geo[G_LH] * Lw;
    const int64_t *xs = geo + G_XS;
    for (int64_t pi = p0; pi < p1; pi++) {
        int64_t n = pi / C, c = pi - n * C;
        DW_NAME(to_phases_)(x + n * xs[0] + c * xs[1], xs[2], xs[3], H, W, tab, nRw, nslots, LL, Lw, xph);
        for (int64_t mo = 0; mo < m; mo++) {
            int64_t co = c * m + mo;
            T *yp = y + (n * C * m + co) * OH * OW;
            memset(yp, 0, OH * OW * sizeof(T));
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t k0 = 0; k0 < K; k0 += 4) {
                    int cnt = K - k0 < 4 ? (int)(K - k0) : 4;
                    const T *src[4];
                    T wt[4];
                    for (int k = 0; k < cnt; k++) {
                        const int64_t *tp = taps + 4 * (k0 + k);
                        src[k] = xph + tp[3] * LL + (oh + tp[1]) * Lw + tp[2];
                        wt[k] = w[co * K + tp[0]];
                    }
                    switch (cnt) {
                    case 4: DW_NAME(axpys_)(yp + oh * OW, src, wt, OW, 4); break;
                    case 3: DW_NAME(axpys_)(yp + oh * OW, src, wt, OW, 3); break;
                    case 2: DW_NAME(axpys_)(yp + oh * OW, src, wt, OW, 2); break;
                    default: DW_NAME(axpys_)(yp + oh * OW, src, wt, OW, 1); break;
                    }
                }
        }
    }
}

#undef DW_V
#undef DW_VL
#undef DW_NAME
#undef DW_CAT
#undef DW_CAT_
