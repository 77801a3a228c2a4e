/* Depthwise loops across channels (float32; see ../depthwise.py, "channel vectors"): 16 channels of one sample at
 * a time, each plane transposed to position-major order so that one 16-float vector holds one position of 16
 * channels. Every sum runs over lane-wise vectors, so small planes (3x3, 6x6, 12x12: a few positions per row)
 * cost no per-plane scalar tails. Included by kernels.c after direct_conv.c (v16, load16, store16, transpose16).
 *
 * The pair tables say which terms a sum has: for output row a, the (tap row, source row) pairs of the terms that
 * exist (rows[roff[a] .. roff[a+1]), two int64 each), likewise for columns. Only terms the convolution defines are
 * multiplied (no padding zero ever meets a value), taps in ascending order, so each output element is a fixed
 * sequence of operations for given shapes and build: bitwise reproducible whatever the task split. */

/* The transpositions below run 16 x 16 tiles in registers where a 16-float vector is one register (the AVX-512
 * build), and two 8 x 8 tiles of AVX registers on the AVX2 build (its emulated 16-float shuffles cost more than the
 * sums on small planes). The positions past the last whole tile element by element. A copy either way: the same
 * bits. (On their own the 8 x 8 tiles did not change the AVX2 build's time; the sums' vectors below did.) */
#define CV_TILE8 HAVE_TILE8             /* vectors.h's transpose8 */

/* The sums' 16-channel vectors: one v16 (an AVX-512 register), or on the AVX2 build two 8-float halves held as
 * such (GCC's 16-float vectors on AVX registers went through memory: the loops ran 4-5x the AVX-512 build's time).
 * Lane by lane the same operations (a multiply-add per term: -ffp-contract), so the same bits on both builds. */
#if DENSE_V8
typedef struct { v8f lo, hi; } cv16;
static inline cv16 cv_load(const float *p) { cv16 v; memcpy(&v.lo, p, 32); memcpy(&v.hi, p + 8, 32); return v; }
static inline void cv_store(float *p, cv16 v) { memcpy(p, &v.lo, 32); memcpy(p + 8, &v.hi, 32); }
static inline cv16 cv_zero(void) { cv16 v = {{0}, {0}}; return v; }
static inline cv16 cv_mac(cv16 acc, cv16 a, cv16 b) { acc.lo += a.lo * b.lo; acc.hi += a.hi * b.hi; return acc; }
static inline cv16 cv_add(cv16 a, cv16 b) { a.lo += b.lo; a.hi += b.hi; return a; }
static inline cv16 cv_times0(cv16 a) { a.lo *= 0.0f; a.hi *= 0.0f; return a; }
#else
typedef v16 cv16;
static inline cv16 cv_load(const float *p) { return load16(p); }
static inline void cv_store(float *p, cv16 v) { store16(p, v); }
static inline cv16 cv_zero(void) { cv16 v = {0}; return v; }
static inline cv16 cv_mac(cv16 acc, cv16 a, cv16 b) { return acc + a * b; }
static inline cv16 cv_add(cv16 a, cv16 b) { return a + b; }
static inline cv16 cv_times0(cv16 a) { return a * 0.0f; }
#endif

/* 16 planes of n positions (plane l at src + l * ld) -> dst[u * 16 + l] */
static void cv_planes_in(const float *src, int64_t ld, int64_t n, float *dst) {
    int64_t u = 0;
#if defined(HAVE_TILE16) && !DENSE_V8
    for (; u + 16 <= n; u += 16) {
        v16 t[16];
        for (int i = 0; i < 16; i++) t[i] = load16(src + i * ld + u);
        transpose16(t);
        for (int i = 0; i < 16; i++) store16(dst + (u + i) * 16, t[i]);
    }
#endif
#if CV_TILE8
    for (; u + 8 <= n; u += 8)
        for (int h = 0; h < 2; h++) {          /* planes 8 h .. 8 h + 7: lanes 8 h .. of positions u .. u + 7 */
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (8 * h + i) * ld + u);
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + (u + i) * 16 + 8 * h, r[i]);
        }
#endif
    for (; u < n; u++)
        for (int l = 0; l < 16; l++) dst[u * 16 + l] = src[l * ld + u];
}

/* src[u * 16 + l] -> 16 planes of n positions (plane l at dst + l * ld) */
static void cv_planes_out(const float *src, int64_t n, float *dst, int64_t ld) {
    int64_t u = 0;
#if defined(HAVE_TILE16) && !DENSE_V8
    for (; u + 16 <= n; u += 16) {
        v16 t[16];
        for (int i = 0; i < 16; i++) t[i] = load16(src + (u + i) * 16);
        transpose16(t);
        for (int i = 0; i < 16; i++) store16(dst + i * ld + u, t[i]);
    }
#endif
#if CV_TILE8
    for (; u + 8 <= n; u += 8)
        for (int h = 0; h < 2; h++) {          /* lanes 8 h .. 8 h + 7 of positions u .. u + 7 -> their planes */
            __m256 r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (u + i) * 16 + 8 * h);
            transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + (8 * h + i) * ld + u, r[i]);
        }
#endif
    for (; u < n; u++)
        for (int l = 0; l < 16; l++) dst[l * ld + u] = src[u * 16 + l];
}

/* out[n, c, a, b] = sum over (kh, i) in rows(a), (kw, j) in cols(b) of w[c, kh * KW + kw] * in[n, c, i, j], for the
 * items [i0, i1) of (sample, 16-channel block) (C channels, C % 16 == 0). in: (N, C, Hi, Wi), out: (N, C, Ho, Wo),
 * C-contiguous; wt: (K, C), the weights transposed. reg[b] (b < Wo - 3): columns b .. b + 3 have the pairs of b,
 * source columns moved by step per column (four sums at once). scratch: (Hi * Wi + Ho * Wo) * 16 floats. */
void xconv_dwcv_gather(const float *in, int64_t C, int64_t Hi, int64_t Wi, float *out, int64_t Ho, int64_t Wo,
                       const float *wt, int64_t KW, const int64_t *roff, const int64_t *rows, const int64_t *coff,
                       const int64_t *cols, const int64_t *reg, int64_t step, int64_t i0, int64_t i1,
                       float *scratch) {
    const int64_t CB = C / 16, Pi = Hi * Wi, Po = Ho * Wo;
    float *S = scratch, *D = scratch + Pi * 16;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t n = it / CB, c0 = it % CB * 16;
        cv_planes_in(in + (n * C + c0) * Pi, Pi, Pi, S);
        for (int64_t a = 0; a < Ho; a++) {
            float *d = D + a * Wo * 16;
            int64_t b = 0;
            while (b < Wo) {
                if (b + 4 <= Wo && reg[b]) {
                    cv16 acc0 = cv_zero(), acc1 = cv_zero(), acc2 = cv_zero(), acc3 = cv_zero();
                    for (int64_t r = roff[a]; r < roff[a + 1]; r++) {
                        const int64_t kh = rows[2 * r], i = rows[2 * r + 1];
                        for (int64_t q = coff[b]; q < coff[b + 1]; q++) {
                            const int64_t kw = cols[2 * q], j = cols[2 * q + 1];
                            const cv16 wv = cv_load(wt + (kh * KW + kw) * C + c0);
                            const float *s = S + (i * Wi + j) * 16;
                            acc0 = cv_mac(acc0, wv, cv_load(s));
                            acc1 = cv_mac(acc1, wv, cv_load(s + step * 16));
                            acc2 = cv_mac(acc2, wv, cv_load(s + 2 * step * 16));
                            acc3 = cv_mac(acc3, wv, cv_load(s + 3 * step * 16));
                        }
                    }
                    cv_store(d + b * 16, acc0);
                    cv_store(d + (b + 1) * 16, acc1);
                    cv_store(d + (b + 2) * 16, acc2);
                    cv_store(d + (b + 3) * 16, acc3);
                    b += 4;
                } else {
                    cv16 acc = cv_zero();
                    for (int64_t r = roff[a]; r < roff[a + 1]; r++) {
                        const int64_t kh = rows[2 * r], i = rows[2 * r + 1];
                        for (int64_t q = coff[b]; q < coff[b + 1]; q++) {
                            const int64_t kw = cols[2 * q], j = cols[2 * q + 1];
                            acc = cv_mac(acc, cv_load(wt + (kh * KW + kw) * C + c0), cv_load(S + (i * Wi + j) * 16));
                        }
                    }
                    cv_store(d + b * 16, acc);
                    b += 1;
                }
            }
        }
        cv_planes_out(D, Po, out + (n * C + c0) * Po, Po);
    }
}

/* dwp[n, c, t] = sum over dy positions (a, b) whose tap t reads the input (rows a in [alo[kh], ahi[kh]), columns b
 * in [blo[kw], bhi[kw])) of dy[n, c, a, b] * x[n, c, a * sh + kh * dh - ph, b * sw + kw * dw - pw], for the items
 * [i0, i1) of (sample, 16-channel block); four partial sums over b mod 4, added as (s0 + s1) + (s2 + s3); in a block
 * whose dy holds an infinity or NaN, then plus the skipped terms dy * 0 (NaN where dy is not finite). x: (N, C,
 * H, W), dy: (N, C, Ho, Wo), C-contiguous; dwp: (N, C, KH * KW). scratch: (H * W + Ho * Wo) * 16 + KH * KW * 16
 * floats. */
void xconv_dwcv_wgrad(const float *x, const float *dy, int64_t C, int64_t H, int64_t W, int64_t Ho, int64_t Wo,
                      int64_t KH, int64_t KW, const int64_t *geo, const int64_t *alo, const int64_t *ahi,
                      const int64_t *blo, const int64_t *bhi, float *dwp, int64_t i0, int64_t i1, float *scratch) {
    const int64_t sh = geo[0], sw = geo[1], dh = geo[2], dw = geo[3], ph = geo[4], pw = geo[5];
    const int64_t CB = C / 16, P = H * W, Po = Ho * Wo, K = KH * KW;
    float *SX = scratch, *SY = scratch + P * 16, *acc = SY + Po * 16;
    for (int64_t it = i0; it < i1; it++) {
        const int64_t n = it / CB, c0 = it % CB * 16;
        cv_planes_in(x + (n * C + c0) * P, P, P, SX);
        cv_planes_in(dy + (n * C + c0) * Po, Po, Po, SY);
        /* an infinity or NaN in dy: the terms dy * (padding zero) that the sums above skip are NaN (0 * inf), as
         * on the exact path; added after the sum, for such blocks only */
        cv16 bad = cv_zero();
        for (int64_t u = 0; u < Po; u++) bad = cv_add(bad, cv_times0(cv_load(SY + u * 16)));
        int nonfinite = 0;
        float lanes[16];
        cv_store(lanes, bad);
        for (int l = 0; l < 16; l++) nonfinite |= lanes[l] != lanes[l];
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                cv16 s0 = cv_zero(), s1 = cv_zero(), s2 = cv_zero(), s3 = cv_zero();
                const int64_t b0 = blo[kw], b1 = bhi[kw];
                for (int64_t a = alo[kh]; a < ahi[kh]; a++) {
                    const float *yr = SY + a * Wo * 16;
                    const int64_t xrow = (a * sh + kh * dh - ph) * W + kw * dw - pw;     /* + b * sw: column b's */
                    int64_t b = b0;
                    for (; b + 4 <= b1; b += 4) {
                        s0 = cv_mac(s0, cv_load(yr + b * 16), cv_load(SX + (xrow + b * sw) * 16));
                        s1 = cv_mac(s1, cv_load(yr + (b + 1) * 16), cv_load(SX + (xrow + (b + 1) * sw) * 16));
                        s2 = cv_mac(s2, cv_load(yr + (b + 2) * 16), cv_load(SX + (xrow + (b + 2) * sw) * 16));
                        s3 = cv_mac(s3, cv_load(yr + (b + 3) * 16), cv_load(SX + (xrow + (b + 3) * sw) * 16));
                    }
                    for (; b < b1; b++) s0 = cv_mac(s0, cv_load(yr + b * 16), cv_load(SX + (xrow + b * sw) * 16));
                }
                cv16 sum = cv_add(cv_add(s0, s1), cv_add(s2, s3));
                if (nonfinite) {
                    cv16 pad = cv_zero();
                    for (int64_t a = 0; a < Ho; a++)
                        for (int64_t b = 0; b < Wo; b++)
                            if (a < alo[kh] || a >= ahi[kh] || b < b0 || b >= b1)
                                pad = cv_add(pad, cv_times0(cv_load(SY + (a * Wo + b) * 16)));
                    sum = cv_add(sum, pad);
                }
                cv_store(acc + (kh * KW + kw) * 16, sum);
            }
        float *dst = dwp + (n * C + c0) * K;
        for (int l = 0; l < 16; l++)
            for (int64_t t = 0; t < K; t++) dst[l * K + t] = acc[t * 16 + l];
    }
}
