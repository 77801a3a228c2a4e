/* The forward and weight gradient of convolutions with few input channels (a network's stem: 3 colour channels, 7x7
 * or 3x3 taps, stride 2) in float32: direct loops vectorized along output rows (see ../stem.py). The weight gradient
 * is below its own comment further down; the forward:
 *
 * Per output row (n, od, oh): each input row a tap row (c, kd, kh) reads is copied once into `stride w` phase rows
 * (phase r holds x[..., j * sw + r - pw], zero outside the input), so every tap (kw) of the row is a contiguous
 * vector load at a constant offset whatever the stride. Then blocks of KT output channels x 2 vectors of STEM_L output
 * positions sum, in registers, over the tap rows in order and each row's taps in order; the block is stored
 * (plus the bias, added last) into y (N, Co, OD, OH, OW; contiguous). Every output element is one such sum in one
 * fixed order, whatever thread runs its row: bitwise reproducible. Padding zeros are multiplied (the caller routes
 * non-finite inputs elsewhere). geo: csrc/layout.h's XCONV_SMALL_COLS_GEO (S_*), 1-D and 2-D lifted to 3-D. */
#include <stdint.h>
#include <string.h>

#include "layout.h"

/* STEM_L floats per vector: one register of the build (AVX-512 16, AVX2 8, SSE 4: a wider GCC vector than the
 * registers goes through memory on every operation); its 32 or 16 registers set the register blocks. */
#if defined(__AVX512F__)
#define STEM_L 16
#define STEM_KT 12
#elif defined(__AVX2__)
#define STEM_L 8
#define STEM_KT 6
#else
#define STEM_L 4
#define STEM_KT 6
#endif
/* Forward: STEM_KT output channels x 2 vectors of positions per block (24 accumulators of 32 registers, or 12 of 16) */
#define STEM_VW 2

typedef float stem_vec __attribute__((vector_size(4 * STEM_L)));
/* v held in a register from here on (an empty asm that reads and writes it): GCC would otherwise fold its load into
 * every multiply-add that uses it (a memory operand each), and the weight gradient's loops were bound by their loads.
 * The AVX-512 build only (32 registers hold a block's sums and its tap vectors; the AVX2 build's 16 do not). */
#if defined(__AVX512F__)
#define STEM_REGS 32
#define STEM_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define STEM_REGS 16
#define STEM_IN_REGISTER(v) ((void)0)
#endif

static inline stem_vec stem_load(const float *p) { stem_vec v; memcpy(&v, p, sizeof v); return v; }
/* The lanes of v added in order. */
static inline float stem_lane_sum(stem_vec v) {
    float s = 0.0f;
    for (int l = 0; l < STEM_L; l++) s += v[l];
    return s;
}

/* Stride 2, a contiguous row: both phase rows at once, STEM_L elements of each from two loads (the even and the odd
 * lanes; phase q's element j is src[2 j + q - pw]) where the row holds them, element by element at the ends. */
static void stem_phase_pairs(const float *src, int64_t W, int64_t pw, int64_t lq, float *buf) {
    int64_t j = 0;
    for (; j < lq && 2 * j - pw < 0; j++) {                 /* the left end: the padding's zeros */
        buf[j] = 0.0f;
        buf[lq + j] = 2 * j + 1 - pw >= 0 && 2 * j + 1 - pw < W ? src[2 * j + 1 - pw] : 0.0f;
    }
#if defined(__GNUC__) && !defined(__clang__)
    typedef int32_t stem_idx __attribute__((vector_size(4 * STEM_L)));
    stem_idx ev, od;
    for (int l = 0; l < STEM_L; l++) { ev[l] = 2 * l; od[l] = 2 * l + 1; }
    const int64_t pairs = (W + pw) / 2 < lq ? (W + pw) / 2 : lq;     /* j < pairs: both elements inside the row */
    if (pairs - j >= STEM_L)
        for (;;) {
            const float *s = src + 2 * j - pw;
            const stem_vec a = stem_load(s), b = stem_load(s + STEM_L);
            const stem_vec e = __builtin_shuffle(a, b, ev), o = __builtin_shuffle(a, b, od);
            memcpy(buf + j, &e, sizeof e);
            memcpy(buf + lq + j, &o, sizeof o);
            if (j + STEM_L == pairs) { j = pairs; break; }
            j = j + 2 * STEM_L <= pairs ? j + STEM_L : pairs - STEM_L;   /* the last block overlaps the one before */
        }
#endif
    for (; j < lq && 2 * j - pw < W; j++) {                /* the right end (2 j - pw >= 0 past the left end) */
        buf[j] = src[2 * j - pw];
        buf[lq + j] = 2 * j + 1 - pw < W ? src[2 * j + 1 - pw] : 0.0f;
    }
    if (j < lq) {                                          /* past the row: zeros */
        memset(buf + j, 0, (size_t)(lq - j) * sizeof(float));
        memset(buf + lq + j, 0, (size_t)(lq - j) * sizeof(float));
    }
}

/* One input row (W elements at stride xw) as its sw phase rows of lq floats: phase q's element j is
 * x[j * sw + q - pw], 0 outside the row. */
static void stem_phase_row(const float *src, int64_t xw, int64_t W, int64_t pw, int64_t sw, int64_t lq, float *buf) {
    if (sw == 2 && xw == 1) {           /* the stems' stride on a contiguous row */
        stem_phase_pairs(src, W, pw, lq, buf);
        return;
    }
    for (int64_t q = 0; q < sw; q++) {
        float *out = buf + q * lq;
        int64_t lo = q - pw >= 0 ? 0 : (pw - q + sw - 1) / sw;
        int64_t hi = W - 1 - (q - pw) < 0 ? 0 : (W - 1 - (q - pw)) / sw + 1;
        if (hi > lq) hi = lq;
        if (lo > hi) lo = hi;
        memset(out, 0, (size_t)lo * sizeof(float));
        const float *s0 = src + (q - pw) * xw;
        const int64_t step = sw * xw;
        for (int64_t j = lo; j < hi; j++) out[j] = s0[j * step];
        memset(out + hi, 0, (size_t)(lq - hi) * sizeof(float));
    }
}

/* The length of a phase row for geometry g (room for 32-lane blocks past the last output and the widest tap). */
static inline int64_t stem_lq(const int64_t *g) {
    return (g[S_OW] + 31) / 32 * 32 + ((g[S_KW] - 1) * g[S_DW]) / g[S_SW] + 1;
}

/* Scratch floats per thread for geometry g: the phase rows of every tap row, then (int64) their weight offsets and
 * the taps' offsets in a tap row. */
int64_t xconv_stem_scratch(const int64_t *g) {
    const int64_t rows = g[S_C] * g[S_KD] * g[S_KH], sw = g[S_SW], lq = stem_lq(g);
    return rows * sw * lq + 2 * (rows + g[S_KW]) + 16;
}

/* y[k0 .. k0 + KT) x [ow0, ow0 + STEM_L * VW) of one output row: KT and VW constants (inlined per block shape). */
static inline __attribute__((always_inline)) void stem_block(
    const int KT, const int VW, const float *rows, const int64_t *widx, int64_t nt, const float *w, int64_t CK,
    int64_t KW, const int64_t *kwo, int64_t sw, int64_t lq, int64_t ow0, int64_t OW, const float *bias, float *y,
    int64_t plane) {
    stem_vec acc[STEM_KT][2];
    for (int kt = 0; kt < KT; kt++)
        for (int v = 0; v < VW; v++) acc[kt][v] = (stem_vec){0};
    for (int64_t t = 0; t < nt; t++) {
        const float *buf = rows + t * sw * lq + ow0, *wt = w + widx[t];
        for (int64_t kw = 0; kw < KW; kw++) {
            const float *xs = buf + kwo[kw];
            stem_vec xv[2];
            for (int v = 0; v < VW; v++) xv[v] = stem_load(xs + STEM_L * v);
            for (int kt = 0; kt < KT; kt++) {
                const float s = wt[kt * CK + kw];
                for (int v = 0; v < VW; v++) acc[kt][v] += s * xv[v];
            }
        }
    }
    for (int kt = 0; kt < KT; kt++) {
        const float b = bias ? bias[kt] : 0.0f;
        for (int v = 0; v < VW; v++) {
            const int64_t at = ow0 + STEM_L * v, lanes = OW - at < STEM_L ? OW - at : STEM_L;
            if (lanes <= 0) break;
            stem_vec r = acc[kt][v];
            if (bias) r += b;
            memcpy(y + kt * plane + at, &r, (size_t)lanes * sizeof(float));
        }
    }
}

/* The KT-channel blocks of one output row, then the channels left (8, 4 at a time, then one by one). With blocks of
 * 6 (the AVX2 build's, where the stem loops run; the baseline build compiles the same): from 8 channels the last
 * blocks hold 4 or 5 channels (STEM_TAIL45), never 1 to 3. A block of KT channels takes max(KT, 4) cycles a tap
 * (2 x KT multiply-adds, two a cycle, each sum's chain 4 cycles long), so 32 channels as 6 x 5 + 1 + 1 took 38
 * cycles a tap and take 32 as 6 x 4 + 4 + 4 (the 3-D net's and the U-Net's stems). Each output element is the same
 * sum in the same order in any block: the bits are the same. */
static void stem_row(const float *rows, const int64_t *widx, int64_t nt, const float *w, int64_t Co, int64_t CK,
                     int64_t KW, const int64_t *kwo, int64_t sw, int64_t lq, int64_t OW, const float *bias, float *y,
                     int64_t plane) {
    int64_t k = 0;
    int64_t end = Co;                      /* STEM_BLOCKS(KT) runs KT-channel blocks while they fit before end */
#define STEM_BLOCKS(KT)                                                                                     \
    for (; k + (KT) <= end; k += (KT))                                                                      \
        for (int64_t ow0 = 0; ow0 < OW; ow0 += STEM_L * STEM_VW) {                                          \
            const float *bk = bias ? bias + k : 0;                                                          \
            if (OW - ow0 > STEM_L)                                                                          \
                stem_block((KT), 2, rows, widx, nt, w + k * CK, CK, KW, kwo, sw, lq, ow0, OW, bk, y + k * plane, \
                           plane);                                                                          \
            else                                                                                            \
                stem_block((KT), 1, rows, widx, nt, w + k * CK, CK, KW, kwo, sw, lq, ow0, OW, bk, y + k * plane, \
                           plane);                                                                          \
        }
#if STEM_KT == 6
    if (Co >= 8) {                         /* STEM_TAIL45: the channels past the 6-blocks as 4s and 5s */
        static const int64_t fours[6] = {0, 2, 2, 1, 1, 0}, fives[6] = {0, 1, 0, 1, 0, 1};
        const int64_t r = Co % 6, tail = 4 * fours[r] + 5 * fives[r];
        end = Co - tail;
        STEM_BLOCKS(6)
        end = Co - 4 * fours[r];
        STEM_BLOCKS(5)
        end = Co;
        STEM_BLOCKS(4)
        return;
    }
#endif
    STEM_BLOCKS(STEM_KT)
#if STEM_KT > 8
    STEM_BLOCKS(8)
#endif
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
    const int64_t lq = stem_lq(g);
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
                    stem_phase_row(src, xw, W, pw, sw, lq, rows + nt * sw * lq);
                    widx[nt++] = ((c * KD + kd) * KH + kh) * KW;
                }
            }
        stem_row(rows, widx, nt, w, Co, CK, KW, kwo, sw, lq, OW, bias, y + n * Co * plane + (od * OH + oh) * OW, plane);
    }
}

/* ---- The weight gradient: dw[k, c, kd, kh, kw] = sum over n, od, oh (in order) of the row sums over ow of
 * dy[n, k, od, oh, ow] * x[n, c, id, ih, ow * sw + kw * dw - pw], each row's products kept in 16 lanes (position
 * ow in lane ow % 16) across all rows, the lanes added in order at the end. x's rows come in their stride phases
 * (xconv_stem_phases, once per call); a job is a block of output channels for one tap row (c, kd, kh): every dw
 * element is one job's, in one order, whatever thread runs it. */

/* Rows [r0, r1) of x's N * C * D * H rows as their phase rows (ph: row r at r * sw * lq floats), lq floats each
 * (0: the stem's stem_lq; the dense loops' strided forward gives its own). Rows r count (n, c, d, h) in C order, or
 * with inter set (n, d, h, c): each input row then holds every channel's phase rows, channel c's at c * sw * lq. */
void xconv_stem_phases(const float *x, float *ph, const int64_t *g, int64_t r0, int64_t r1, int64_t lq,
                       int64_t inter) {
    const int64_t C = g[S_C], D = g[S_D], H = g[S_H], W = g[S_W], sw = g[S_SW], pw = g[S_PW];
    if (lq <= 0) lq = stem_lq(g);
    const int64_t xn = g[S_XS], xc = g[S_XS + 1], xd = g[S_XS + 2], xh = g[S_XS + 3], xw = g[S_XS + 4];
    for (int64_t r = r0; r < r1; r++) {
        const int64_t n = r / (C * D * H);
        const int64_t c = inter ? r % C : r / (D * H) % C, dh = inter ? r / C % (D * H) : r % (D * H);
        stem_phase_row(x + n * xn + c * xc + dh / H * xd + dh % H * xh, xw, W, pw, sw, lq, ph + r * sw * lq);
    }
}

/* Output channels x taps of a row per block (stem_wblock.h): KT * KWC accumulators fill the registers, with the KWC
 * tap vectors of x and one dy vector where they fit (STEM_REGS; AVX-512: 8 x 3 + 3 + 1 and 5 x 5 + 5 + 1 of 32),
 * else with the KT dy vectors and x as memory operands (4 x 7: 3 x 7 blocks with x held ran 10-15% slower): blocks
 * for 7, 5 and 3 taps a row at once, else one tap at a time; STEM_W<taps>: (channels, taps). A block's size and its
 * loop order never change an element's sum (each is its own accumulator, its terms in row order). */
#if defined(__AVX512F__)
#define STEM_W7 4
#define STEM_W5 5
#define STEM_W3 8
#define STEM_W1 16
#else
#define STEM_W7 2
#define STEM_W5 2
#define STEM_W3 4
#define STEM_W1 8
#endif
#define STEM_WT(KW) ((KW) == 7 ? STEM_W7 : (KW) == 5 ? STEM_W5 : (KW) == 3 ? STEM_W3 : STEM_W1)

/* The blocks, stem_w<taps>[t] (full; t: rows not a multiple of STEM_L) and stem_w<taps>_1 (one channel, tails).
 * stem_wblock.h undefines its parameters. */
#define WKT STEM_W7
#define WKC 7
#define WTAIL 0
#define WNAME stem_w7
#include "stem_wblock.h"
#define WKT STEM_W7
#define WKC 7
#define WTAIL 1
#define WNAME stem_w7t
#include "stem_wblock.h"
#define WKT 1
#define WKC 7
#define WTAIL 1
#define WNAME stem_w7_1
#include "stem_wblock.h"
#define WKT STEM_W5
#define WKC 5
#define WTAIL 0
#define WNAME stem_w5
#include "stem_wblock.h"
#define WKT STEM_W5
#define WKC 5
#define WTAIL 1
#define WNAME stem_w5t
#include "stem_wblock.h"
#define WKT 1
#define WKC 5
#define WTAIL 1
#define WNAME stem_w5_1
#include "stem_wblock.h"
#define WKT STEM_W3
#define WKC 3
#define WTAIL 0
#define WNAME stem_w3
#include "stem_wblock.h"
#define WKT STEM_W3
#define WKC 3
#define WTAIL 1
#define WNAME stem_w3t
#include "stem_wblock.h"
#define WKT 1
#define WKC 3
#define WTAIL 1
#define WNAME stem_w3_1
#include "stem_wblock.h"
#define WKT STEM_W1
#define WKC 1
#define WTAIL 0
#define WNAME stem_w1
#include "stem_wblock.h"
#define WKT STEM_W1
#define WKC 1
#define WTAIL 1
#define WNAME stem_w1t
#include "stem_wblock.h"
#define WKT 1
#define WKC 1
#define WTAIL 1
#define WNAME stem_w1_1
#include "stem_wblock.h"

/* The number of weight-gradient jobs of a call (blocks of output channels x tap rows). */
int64_t xconv_stem_wjobs(const int64_t *g, int64_t Co) {
    const int64_t kt = STEM_WT(g[S_KW]);
    return (Co + kt - 1) / kt * g[S_C] * g[S_KD] * g[S_KH];
}

/* Jobs [j0, j1) of dw (Co, C, KD, KH, KW; contiguous) from x's phase rows and dy (N, Co, OD, OH, OW; contiguous);
 * OW >= 16 (so >= STEM_L). */
void xconv_stem_wgrad(const float *ph, const float *dy, float *dw, const int64_t *g, int64_t Co, int64_t j0,
                      int64_t j1) {
    const int64_t KW = g[S_KW], rows = g[S_C] * g[S_KD] * g[S_KH], lq = stem_lq(g), sw = g[S_SW], dw_ = g[S_DW];
    int64_t kwo[KW];
    for (int64_t kw = 0; kw < KW; kw++) kwo[kw] = (kw * dw_) % sw * lq + (kw * dw_) / sw;
    for (int64_t j = j0; j < j1; j++) {
        const int64_t t = j % rows, k0 = j / rows * STEM_WT(KW);
        const int64_t kn = Co - k0 < STEM_WT(KW) ? Co - k0 : STEM_WT(KW);
        const int row_tail = g[S_OW] % STEM_L != 0;
#define STEM_W(KWV, FULL, FULLT, ONE)                                                                        \
        if (KW == (KWV)) {                                                                                   \
            if (kn == STEM_WT(KWV))                                                                          \
                (row_tail ? FULLT : FULL)(ph, dy, dw, g, Co, k0, t, 0, kwo, lq);                             \
            else                                                                                             \
                for (int64_t k = k0; k < k0 + kn; k++) ONE(ph, dy, dw, g, Co, k, t, 0, kwo, lq);             \
            continue;                                                                                        \
        }
        STEM_W(7, stem_w7, stem_w7t, stem_w7_1) STEM_W(5, stem_w5, stem_w5t, stem_w5_1)
        STEM_W(3, stem_w3, stem_w3t, stem_w3_1)
#undef STEM_W
        for (int64_t kw = 0; kw < KW; kw++) {
            if (kn == STEM_WT(1))
                (row_tail ? stem_w1t : stem_w1)(ph, dy, dw, g, Co, k0, t, kw, kwo, lq);
            else
                for (int64_t k = k0; k < k0 + kn; k++) stem_w1_1(ph, dy, dw, g, Co, k, t, kw, kwo, lq);
        }
    }
}
