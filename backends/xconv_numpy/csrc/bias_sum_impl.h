/* The bias sum of bias_sum.c for one element type T (suffix SUF; XCONV_TO_DOUBLE converts one element). */

/* Eight elements from q at element stride sw, converted (lane k: q[k * sw]). */
static inline __attribute__((always_inline)) xconv_v8d XCONV_T(xconv_bias_load8)(const T *q, int64_t sw) {
    xconv_v8d v;
    for (int k = 0; k < 8; k++) v[k] = XCONV_TO_DOUBLE(q[k * sw]);
    return v;
}

/* NumPy's pairwise sum of n <= XCONV_PW_BLOCK elements at element stride sw from p (its two leaf cases), read in
 * place. The eight accumulators are the eight lanes of one vector (lane k: r[k], each lane's order NumPy's). */
static inline __attribute__((always_inline)) double XCONV_T(xconv_bias_leaf)(const T *p, int64_t sw, int64_t n) {
    if (n < 8) {
        double res = -0.0;
        for (int64_t i = 0; i < n; i++) res += XCONV_TO_DOUBLE(p[i * sw]);
        return res;
    }
    int64_t i;
    xconv_v8d r = XCONV_T(xconv_bias_load8)(p, sw);
    for (i = 8; i < n - (n % 8); i += 8) r += XCONV_T(xconv_bias_load8)(p + i * sw, sw);
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += XCONV_TO_DOUBLE(p[i * sw]);
    return res;
}

static double XCONV_T(xconv_bias_pairwise_run)(const T *p, int64_t sw, int64_t n) {
    if (n <= XCONV_PW_BLOCK) return sw == 1 ? XCONV_T(xconv_bias_leaf)(p, 1, n) : XCONV_T(xconv_bias_leaf)(p, sw, n);
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    const double left = XCONV_T(xconv_bias_pairwise_run)(p, sw, n2);
    const double right = XCONV_T(xconv_bias_pairwise_run)(p + n2 * sw, sw, n - n2);
    return left + right;
}

/* The walk's next n elements, converted, into buf. */
static inline void XCONV_T(xconv_bias_fill)(xconv_bias_walk *c, double *buf, int64_t n) {
    while (n > 0) {
        int64_t k = c->W - c->w;
        if (k > n) k = n;
        const T *p = (const T *)c->row + c->d * c->sd + c->h * c->sh + c->w * c->sw;
        const int64_t sw = c->sw;
        if (sw == 1)
            for (int64_t j = 0; j < k; j++) buf[j] = XCONV_TO_DOUBLE(p[j]);
        else
            for (int64_t j = 0; j < k; j++) buf[j] = XCONV_TO_DOUBLE(p[j * sw]);
        buf += k;
        n -= k;
        c->w += k;
        if (c->w == c->W) {
            c->w = 0;
            if (++c->h == c->H) {
                c->h = 0;
                c->d++;
            }
        }
    }
}

/* NumPy's pairwise sum of the walk's next n elements (n > 0), left half first; buf holds XCONV_PW_BLOCK doubles. */
static double XCONV_T(xconv_bias_pairwise)(xconv_bias_walk *c, int64_t n, double *buf) {
    if (n <= XCONV_PW_BLOCK) {
        XCONV_T(xconv_bias_fill)(c, buf, n);
        return xconv_bias_leaf_f64(buf, 1, n);                 /* the double instance's (included first) */
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    const double left = XCONV_T(xconv_bias_pairwise)(c, n2, buf);
    const double right = XCONV_T(xconv_bias_pairwise)(c, n - n2, buf);
    return left + right;
}

/* geo: csrc/layout.h's XCONV_BIAS_GEO (B_*): N, C, spatial dims (d, h, w; 1-D and 2-D lifted with unit leading
 * dims), element strides (n, c, d, h, w); every size positive. out: C doubles, or C floats when out_f32 (each sum
 * rounded once to float); a NaN sum is written as the canonical NaN (see ../bias.py). */
void XCONV_T(xconv_bias_sum)(const T *dy, const int64_t *g, void *out, int64_t out_f32) {
    const int64_t N = g[B_N], C = g[B_C], sn = g[B_S], sc = g[B_S + 1];
    /* the row's spatial dims, size-1 ones dropped and those whose elements follow on merged (fewer, longer runs;
     * the row's C order is unchanged), then lifted back to three */
    int64_t dims[3] = {1, 1, 1}, st[3] = {0, 0, 0}, k = 3;
    for (int j = 2; j >= 0; j--) {
        const int64_t size = g[B_D + j], stride = g[B_S + 2 + j];
        if (size == 1) continue;
        if (k < 3 && stride == st[k] * dims[k])
            dims[k] *= size;
        else {
            k--;
            dims[k] = size;
            st[k] = stride;
        }
    }
    const int64_t P = dims[0] * dims[1] * dims[2], runs = dims[0] * dims[1];
    double buf[XCONV_PW_BLOCK];
    for (int64_t o = 0; o < C; o++) {
        double acc = 0.0;
        for (int64_t n = 0; n < N; n++) {
            const T *first = dy + n * sn + o * sc;
            double sum;
            if (runs == 1)
                sum = XCONV_T(xconv_bias_pairwise_run)(first, st[2], P);
            else {
                xconv_bias_walk w = {(const char *)first, dims[1], dims[2], st[0], st[1], st[2], 0, 0, 0};
                sum = XCONV_T(xconv_bias_pairwise)(&w, P, buf);
            }
            const double row = 0.0 + sum;
            acc = n == 0 ? row : acc + row;
        }
        if (acc != acc) acc = __builtin_nan("");       /* the canonical NaN, 0x7ff8000000000000 (np.nan) */
        if (out_f32)
            ((float *)out)[o] = (float)acc;
        else
            ((double *)out)[o] = acc;
    }
}
