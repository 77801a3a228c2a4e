/* The column copies of small_cols.c for one element type T (suffix SUF). */

/* The rows of channels [c0, c1) (all their taps) of x's columns. */
void XCONV_T(xconv_small_im2col_range)(const T *x, T *cols, const int64_t *g, int64_t c0, int64_t c1) {
    const int64_t N = g[S_N], C = g[S_C], D = g[S_D], H = g[S_H], W = g[S_W];
    const int64_t OD = g[S_OD], OH = g[S_OH], OW = g[S_OW], KD = g[S_KD], KH = g[S_KH], KW = g[S_KW];
    const int64_t sd = g[S_SD], sh = g[S_SH], sw = g[S_SW], dd = g[S_DD], dh = g[S_DH], dw = g[S_DW];
    const int64_t pd = g[S_PD], ph = g[S_PH], pw = g[S_PW];
    const int64_t xn = g[S_XS], xc = g[S_XS + 1], xd = g[S_XS + 2], xh = g[S_XS + 3], xw = g[S_XS + 4];
    const int64_t Q = OD * OH * OW, NQ = N * Q;
    T *row = cols + c0 * KD * KH * KW * NQ;
    (void)C;
#if XCONV_MASKED_ROWS
    if (D * H * W <= 16 && Q <= 16 && KD * KH * KW <= 64 && xw == 1 && (H == 1 || xh == W) && (D == 1 || xd == H * W)) {
        /* planes of at most 16 elements (a deep layer's 4x4, 2x2): a (sample, channel) plane in one register, each
         * tap's Q columns one permutation of it (its positions outside the input zeroed by the mask) */
        const int64_t K = KD * KH * KW;
        __m512i idx[64];
        __mmask16 ok[64];
        xconv_plane_perms(g, 0, idx, ok);
        const __mmask16 in_mask = (__mmask16)((1u << (D * H * W)) - 1), out_mask = (__mmask16)((1u << Q) - 1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t n = 0; n < N; n++) {
                const __m512 plane = _mm512_maskz_loadu_ps(in_mask, x + n * xn + c * xc);
                T *out = row + (c - c0) * K * NQ + n * Q;
                for (int64_t t = 0; t < K; t++, out += NQ)
                    _mm512_mask_storeu_ps(out, out_mask, _mm512_maskz_permutexvar_ps(ok[t], idx[t], plane));
            }
        return;
    }
    if (D * H * W <= 64 && Q <= 64 && KD * KH * KW * ((Q + 15) / 16) <= XCONV_PLANE64_ENTRIES && xw == 1
            && (H == 1 || xh == W) && (D == 1 || xd == H * W)) {
        /* planes of at most 64 elements (a ResNet's 7x7, 8x8 -> 4x4 at stride 2): four registers, each tap's chunks
         * of 16 columns picked from them (xconv_plane_perms64) */
        const int64_t K = KD * KH * KW, P = D * H * W, chunks = (Q + 15) / 16;
        xconv_perms64 pm;
        xconv_plane_perms64(g, 0, chunks, &pm);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t n = 0; n < N; n++) {
                __m512 plane[4];
                xconv_load64(x + n * xn + c * xc, P, plane);
                T *out = row + (c - c0) * K * NQ + n * Q;
                for (int64_t t = 0; t < K; t++, out += NQ)
                    for (int64_t j = 0; j < chunks; j++) {
                        const int64_t e = t * chunks + j;
                        _mm512_mask_storeu_ps(out + 16 * j, j == chunks - 1 ? pm.last : (__mmask16)0xFFFF,
                                              xconv_pick64(plane, pm.idx[e], pm.lo[e], pm.hi[e]));
                    }
            }
        return;
    }
#endif
    for (int64_t c = c0; c < c1; c++)
        for (int64_t kd = 0; kd < KD; kd++)
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++, row += NQ) {
                    const int64_t offw = kw * dw - pw;
                    int64_t lo, hi;
                    xconv_valid_range(offw, sw, W, OW, &lo, &hi);
#if XCONV_MASKED_ROWS
                    /* a row of at most 16 elements spanning at most 16 inputs: one masked load of the lanes it reads
                     * (the others not read: AVX-512 suppresses their faults), one permutation at a stride, one masked
                     * store */
                    const int masked = xw == 1 && OW <= 16 && (OW - 1) * sw < 16;
                    unsigned ld = 0, keep = 0;
                    int32_t lane[16] = {0};
                    for (int64_t o = lo; masked && o < hi; o++) {
                        ld |= 1u << (o * sw);
                        keep |= 1u << o;
                        lane[o] = (int32_t)(o * sw);
                    }
                    const __m512i pick = _mm512_loadu_si512(lane);
                    const __mmask16 out_mask = (__mmask16)((1u << OW) - 1);
#endif
                    for (int64_t n = 0; n < N; n++) {
                        T *out = row + n * Q;
                        for (int64_t od = 0; od < OD; od++) {
                            const int64_t id = od * sd - pd + kd * dd;
                            for (int64_t oh = 0; oh < OH; oh++, out += OW) {
                                const int64_t ih = oh * sh - ph + kh * dh;
                                if (id < 0 || id >= D || ih < 0 || ih >= H) {
                                    memset(out, 0, (size_t)OW * sizeof(T));
                                    continue;
                                }
                                const T *in = x + n * xn + c * xc + id * xd + ih * xh + offw * xw;
#if XCONV_MASKED_ROWS
                                if (masked) {
                                    const __m512 v = _mm512_maskz_loadu_ps((__mmask16)ld, in);
                                    _mm512_mask_storeu_ps(out, out_mask, sw == 1 ? v
                                                          : _mm512_maskz_permutexvar_ps((__mmask16)keep, pick, v));
                                    continue;
                                }
#endif
                                for (int64_t o = 0; o < lo; o++) out[o] = 0;
                                if (sw == 1 && xw == 1)
                                    for (int64_t o = lo; o < hi; o++) out[o] = in[o];
                                else
                                    for (int64_t o = lo; o < hi; o++) out[o] = in[o * sw * xw];
                                for (int64_t o = hi; o < OW; o++) out[o] = 0;
                            }
                        }
                    }
                }
}

void XCONV_T(xconv_small_im2col)(const T *x, T *cols, const int64_t *g) {
    XCONV_T(xconv_small_im2col_range)(x, cols, g, 0, g[S_C]);
}

/* dx's planes of channels [c0, c1) (every sample) from the columns. */
void XCONV_T(xconv_small_col2im_range)(const T *dcols, T *dx, const int64_t *g, int64_t c0, int64_t c1) {
    const int64_t N = g[S_N], C = g[S_C], D = g[S_D], H = g[S_H], W = g[S_W];
    const int64_t OD = g[S_OD], OH = g[S_OH], OW = g[S_OW], KD = g[S_KD], KH = g[S_KH], KW = g[S_KW];
    const int64_t sd = g[S_SD], sh = g[S_SH], sw = g[S_SW], dd = g[S_DD], dh = g[S_DH], dw = g[S_DW];
    const int64_t pd = g[S_PD], ph = g[S_PH], pw = g[S_PW];
    const int64_t K = KD * KH * KW, Q = OD * OH * OW, NQ = N * Q, P = D * H * W;
#if XCONV_MASKED_ROWS
    if (P <= 16 && Q <= 16 && K <= 64) {
        /* planes of at most 16 elements: each tap's Q columns moved to the input positions they read by one
         * permutation (a tap reads each input position at most once) and added, taps in order: the sums of the row
         * loops below, in their order (lanes without a term add +0 to a sum that is never -0) */
        __m512i inv[64];
        __mmask16 ok[64];
        xconv_plane_perms(g, 1, inv, ok);
        const __mmask16 in_mask = (__mmask16)((1u << Q) - 1), out_mask = (__mmask16)((1u << P) - 1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t n = 0; n < N; n++) {
                __m512 acc = _mm512_setzero_ps();
                const T *row = dcols + c * K * NQ + n * Q;
                for (int64_t t = 0; t < K; t++, row += NQ)
                    acc = _mm512_add_ps(acc, _mm512_maskz_permutexvar_ps(ok[t], inv[t], _mm512_maskz_loadu_ps(in_mask, row)));
                _mm512_mask_storeu_ps(dx + (n * C + c) * P, out_mask, acc);
            }
        return;
    }
    if (P <= 64 && Q <= 64 && K * ((P + 15) / 16) <= XCONV_PLANE64_ENTRIES) {
        /* planes of at most 64 elements: each tap's row of Q columns in four registers, each 16-element chunk of dx's
         * plane picked from them (xconv_plane_perms64, inverse) and added, taps in order: the row loops' sums, in
         * their order, as above */
        const int64_t chunks = (P + 15) / 16;
        xconv_perms64 pm;
        xconv_plane_perms64(g, 1, chunks, &pm);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t n = 0; n < N; n++) {
                /* four named registers, each the sum so far first: an array of accumulators lived in memory, where
                 * GCC put the new term first, and of two NaNs the later tap's came out (the row loops': the first) */
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                const T *row = dcols + c * K * NQ + n * Q;
                for (int64_t t = 0; t < K; t++, row += NQ) {
                    __m512 src[4];
                    xconv_load64(row, Q, src);
                    const int64_t e = t * chunks;
                    a0 = _mm512_add_ps(a0, xconv_pick64(src, pm.idx[e], pm.lo[e], pm.hi[e]));
                    if (chunks > 1)
                        a1 = _mm512_add_ps(a1, xconv_pick64(src, pm.idx[e + 1], pm.lo[e + 1], pm.hi[e + 1]));
                    if (chunks > 2)
                        a2 = _mm512_add_ps(a2, xconv_pick64(src, pm.idx[e + 2], pm.lo[e + 2], pm.hi[e + 2]));
                    if (chunks > 3)
                        a3 = _mm512_add_ps(a3, xconv_pick64(src, pm.idx[e + 3], pm.lo[e + 3], pm.hi[e + 3]));
                }
                T *plane = dx + (n * C + c) * P;
                const __m512 acc[4] = {a0, a1, a2, a3};
                for (int64_t j = 0; j < chunks; j++)
                    _mm512_mask_storeu_ps(plane + 16 * j, j == chunks - 1 ? pm.last : (__mmask16)0xFFFF, acc[j]);
            }
        return;
    }
#endif
    for (int64_t c = c0; c < c1; c++)
        for (int64_t n = 0; n < N; n++) {
            T *plane = dx + (n * C + c) * P;
            memset(plane, 0, (size_t)P * sizeof(T));
            const T *row = dcols + c * K * NQ + n * Q;
            for (int64_t kd = 0; kd < KD; kd++)
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = 0; kw < KW; kw++, row += NQ) {
                        const int64_t offw = kw * dw - pw;
                        int64_t lo, hi;
                        xconv_valid_range(offw, sw, W, OW, &lo, &hi);
                        const T *src = row;
                        for (int64_t od = 0; od < OD; od++) {
                            const int64_t id = od * sd - pd + kd * dd;
                            for (int64_t oh = 0; oh < OH; oh++, src += OW) {
                                const int64_t ih = oh * sh - ph + kh * dh;
                                if (id < 0 || id >= D || ih < 0 || ih >= H) continue;
                                T *dst = plane + (id * H + ih) * W + offw;
                                if (sw == 1)
                                    for (int64_t o = lo; o < hi; o++) dst[o] += src[o];
                                else
                                    for (int64_t o = lo; o < hi; o++) dst[o * sw] += src[o];
                            }
                        }
                    }
        }
}


void XCONV_T(xconv_small_col2im)(const T *dcols, T *dx, const int64_t *g) {
    XCONV_T(xconv_small_col2im_range)(dcols, dx, g, 0, g[S_C]);
}
