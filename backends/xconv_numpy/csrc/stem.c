/* The forward of convolutions with few input channels per output (a network's stem: 3 colour channels, 7x7 or 3x3
 * taps, stride 2) in float32: direct loops vectorized along an output row (see ../stem.py).
 *
 * Per output row (n, od, oh): each input row a tap row (c, kd, kh) reads is copied once into `stride w` phase rows
 * (phase r holds x[..., j * sw + r - pw], zero outside the input), so every tap (kw) of the row is a contiguous
 * vector load at a constant offset whatever the stride. Then blocks of KT output channels x 2 vectors of 16 output
 * positions sum, in registers, over the tap rows in order and each row's taps in order; the block is stored
 * (plus the bias, added last) into y (N, Co, OD, OH, OW; contiguous). Every output element is one such sum in one
 * fixed order, whatever thread runs its row: bitwise reproducible. Padding zeros are multiplied (the caller routes
 * non-finite inputs elsewhere). geo: csrc/layout.h's XCONV_SMALL_COLS_GEO (S_*), 1-D and 2-D lifted to 3-D. */
#include <stdint.h>
#include <string.h>

#include "layout.h"

typedef float stem_v16 __attribute__((vector_size(64)));

static inline stem_v16 stem_load(const float *p) { stem_v16 v; memcpy(&v, p, sizeof v); return v; }

/* Output channels per register block: 12 x 2 vectors of accumulators fill AVX-512's 32 registers; AVX2's 16 (a
 * vector is two of them there) take 6 (the baseline build, four SSE registers per vector, the same: spills). */
#if defined(__AVX512F__)
#define STEM_KT 12
#else
#define STEM_KT 6
#endif

/* Scratch floats per thread for geometry g: the phase rows of every tap row, then (int64) their weight offsets and
 * the taps' offsets in a tap row. */
int64_t xconv_stem_scratch(const int64_t *g) {
    const int64_t rows = g[S_C] * g[S_KD] * g[S_KH], sw = g[S_SW];
    const int64_t lq = (g[S_OW] + 31) / 32 * 32 + ((g[S_KW] - 1) * g[S_DW]) / sw + 1;
    return rows * sw * lq + 2 * (rows + g[S_KW]) + 16;
}

/* y[k0 .. k0 + KT) x [ow0, ow0 + 16 * VW) of one output row: KT and VW constants (inlined per block shape). */
static inline __attribute__((always_inline)) void stem_block(
    const int KT, const int VW, const float *rows, const int64_t *widx, int64_t nt, const float *w, int64_t CK,
    int64_t KW, const int64_t *kwo, int64_t sw, int64_t lq, int64_t ow0, int64_t OW, const float *bias, float *y,
    int64_t plane) {
    stem_v16 acc[STEM_KT][2];
    for (int kt = 0; kt < KT; kt++)
        for (int v = 0; v < VW; v++) acc[kt][v] = (stem_v16){0};
    for (int64_t t = 0; t < nt; t++) {
        const float *buf = rows + t * sw * lq + ow0, *wt = w + widx[t];
        for (int64_t kw = 0; kw < KW; kw++) {
            const float *xs = buf + kwo[kw];
            stem_v16 xv[2];
            for (int v = 0; v < VW; v++) xv[v] = stem_load(xs + 16 * v);
            for (int kt = 0; kt < KT; kt++) {
                const float s = wt[kt * CK + kw];
                for (int v = 0; v < VW; v++) acc[kt][v] += s * xv[v];
            }
        }
    }
    for (int kt = 0; kt < KT; kt++) {
        const float b = bias ? bias[kt] : 0.0f;
        for (int v = 0; v < VW; v++) {
            const int64_t at = ow0 + 16 * v, lanes = OW - at < 16 ? OW - at : 16;
            if (lanes <= 0) break;
            stem_v16 r = acc[kt][v];
            if (bias) r += b;
            memcpy(y + kt * plane + at, &r, (size_t)lanes * sizeof(float));
        }
    }
}

/* The KT-channel blocks of one output row, then the channels left (4 at a time, then one by one). */
static void stem_row(const float *rows, const int64_t *widx, int64_t nt, const float *w, int64_t Co, int64_t CK,
                     int64_t KW, const int64_t *kwo, int64_t sw, int64_t lq, int64_t OW, const float *bias, float *y,
                     int64_t plane) {
    int64_t k = 0;
#define STEM_BLOCKS(KT)                                                                                     \
    for (; k + (KT) <= Co; k += (KT))                                                                       \
        for (int64_t ow0 = 0; ow0 < OW; ow0 += 32) {                                                        \
            const float *bk = bias ? bias + k : 0;                                                          \
            if (OW - ow0 > 16)                                                                              \
                stem_block((KT), 2, rows, widx, nt, w + k * CK, CK, KW, kwo, sw, lq, ow0, OW, bk, y + k * plane, \
                           plane);                                                                          \
            else                                                                                            \
                stem_block((KT), 1, rows, widx, nt, w + k * CK, CK, KW, kwo, sw, lq, ow0, OW, bk, y + k * plane, \
                           plane);                                                                          \
        }
    STEM_BLOCKS(STEM_KT)
    STEM_BLOCKS(4)
    STEM_BLOCKS(1)
#undef STEM_BLOCKS
}

/* Output rows [r0, r1) (row r = (n * OD + od) * OH + oh) of y = conv(x, w) (+ bias: NULL for none); w (Co, C, KD,
 * KH, KW) contiguous, x at its element strides (geo), y contiguous. scratch: xconv_stem_scratch(g) floats. */
void xconv_stem_fprop_rows(const float *x, const float *w, const float *bias, float *y, const int64_t *g,
                           int64_t Co, int64_t r0, int64_t r1, float *scratch) {
    const int64_t C = g[S_C], D = g[S_D], H = g[S_H], W = g[S_W];
    const int64_t OD = g[S_OD], OH = g[S_OH], OW = g[S_OW], KD = g[S_KD], KH = g[S_KH], KW = g[S_KW];
    const int64_t sd = g[S_SD], sh = g[S_SH], sw = g[S_SW], dd = g[S_DD], dh = g[S_DH], dw = g[S_DW];
    const int64_t pd = g[S_PD], ph = g[S_PH], pw = g[S_PW];
    const int64_t xn = g[S_XS], xc = g[S_XS + 1], xd = g[S_XS + 2], xh = g[S_XS + 3], xw = g[S_XS + 4];
    const int64_t CK = C * KD * KH * KW, plane = OD * OH * OW, nrows = C * KD * KH;
    const int64_t lq = (OW + 31) / 32 * 32 + ((KW - 1) * dw) / sw + 1;
    float *rows = scratch;
    int64_t *widx = (int64_t *)(void *)(((uintptr_t)(scratch + nrows * sw * lq) + 7) & ~(uintptr_t)7);
    int64_t *kwo = widx + nrows;                   /* tap kw's offset in a tap row's phase rows */
    for (int64_t kw = 0; kw < KW; kw++) kwo[kw] = (kw * dw) % sw * lq + (kw * dw) / sw;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t n = r / (OD * OH), od = r / OH % OD, oh = r % OH;
        int64_t nt = 0;
        for (int64_t c = 0; c < C; c++)
            for (int64_t kd = 0; kd < KD; kd++) {
                const int64_t id = od * sd - pd + kd * dd;
                if (id < 0 || id >= D) continue;
                for (int64_t kh = 0; kh < KH; kh++) {
                    const int64_t ih = oh * sh - ph + kh * dh;
                    if (ih < 0 || ih >= H) continue;
                    const float *src = x + n * xn + c * xc + id * xd + ih * xh;
                    float *buf = rows + nt * sw * lq;
                    for (int64_t q = 0; q < sw; q++) {     /* phase q: j in [lo, hi) reads x[j * sw + q - pw] */
                        float *ph_ = buf + q * lq;
                        int64_t lo = q - pw >= 0 ? 0 : (pw - q + sw - 1) / sw;
                        int64_t hi = W - 1 - (q - pw) < 0 ? 0 : (W - 1 - (q - pw)) / sw + 1;
                        if (hi > lq) hi = lq;
                        if (lo > hi) lo = hi;
                        memset(ph_, 0, (size_t)lo * sizeof(float));
                        const float *s0 = src + (q - pw) * xw;
                        const int64_t step = sw * xw;
                        for (int64_t j = lo; j < hi; j++) ph_[j] = s0[j * step];
                        memset(ph_ + hi, 0, (size_t)(lq - hi) * sizeof(float));
                    }
                    widx[nt++] = ((c * KD + kd) * KH + kh) * KW;
                }
            }
        stem_row(rows, widx, nt, w, Co, CK, KW, kwo, sw, lq, OW, bias, y + n * Co * plane + (od * OH + oh) * OW, plane);
    }
}
