/* The dense loops' layout copies (see ../dense_weights.py and ../dense.py): x and the weights into channels-last
 * grids, the weight gradient's tap-major sums back to taps last, dy into its zero-padded grid of interleaved rows.
 * Bits are copied, never computed (the sums of dy_to_grid aside). Included by kernels.c after direct_conv.c
 * (vectors.h's types and transpositions). */
#include "vectors.h"


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
