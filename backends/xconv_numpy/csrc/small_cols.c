/* Column copies of the NumPy backend's small-call path (see ../small_c.py), in float and double.
 *
 * im2col: x (N, C, D, H, W; any element strides) -> cols (C * K, N * Q), row c * K + tap, column
 *   n * Q + output position; a tap reading outside the input gives 0.
 * col2im: dcols (C * K, N * Q) -> dx (N, C, D, H, W; contiguous): every dx element the sum, over the taps in order,
 *   of the dcols entries whose tap reads it (0 when none). A fixed order for given shapes: bitwise reproducible.
 * 1-D and 2-D convolutions come lifted to 3-D (unit leading dims). */
#include <stdint.h>
#include <string.h>

#include "layout.h"
#include "template.h"

/* geo: csrc/layout.h's XCONV_SMALL_COLS_GEO (S_*) */

/* The outputs o in [0, O) whose input position o * s + off lies in [0, L): [*lo, *hi). */
static inline void xconv_valid_range(int64_t off, int64_t s, int64_t L, int64_t O, int64_t *lo, int64_t *hi) {
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = L - 1 - off < 0 ? 0 : (L - 1 - off) / s + 1;
    if (b > O) b = O;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* float rows of at most 16 elements at stride 1 copy by one masked load and store on AVX-512 builds (the row loop's
 * per-row work cost more than the copy: 8x256x4x4 3x3, 0.3 ms of a 1.2 ms forward on two threads) */
#if defined(__AVX512F__)
#include <immintrin.h>
#define XCONV_HAVE_MASKED_ROWS 1
#else
#define XCONV_HAVE_MASKED_ROWS 0
#endif

#if XCONV_HAVE_MASKED_ROWS
/* Per tap t (at most 64) of a call whose input and output planes hold at most 16 elements, the lanes of its plane-in-a-
 * register permutation, as the element's index within a (sample, channel) plane. im2col (inverse 0): lane q of idx[t]
 * the input element output position q reads, bit q of ok[t] set where it reads one; col2im (inverse 1): lane i the
 * output position that reads input element i (a tap reads each at most once), bit i set where one does. */
static void xconv_plane_perms(const int64_t *g, int inverse, __m512i *idx, __mmask16 *ok) {
    const int64_t D = g[S_D], H = g[S_H], W = g[S_W], OD = g[S_OD], OH = g[S_OH], OW = g[S_OW];
    const int64_t KD = g[S_KD], KH = g[S_KH], KW = g[S_KW], Q = OD * OH * OW;
    for (int64_t t = 0; t < KD * KH * KW; t++) {
        const int64_t kd = t / (KH * KW), kh = t / KW % KH, kw = t % KW;
        int32_t lane[16] = {0};
        unsigned m = 0;
        for (int64_t q = 0; q < Q; q++) {
            const int64_t od = q / (OH * OW), oh = q / OW % OH, ow = q % OW;
            const int64_t id = od * g[S_SD] - g[S_PD] + kd * g[S_DD], ih = oh * g[S_SH] - g[S_PH] + kh * g[S_DH];
            const int64_t iw = ow * g[S_SW] - g[S_PW] + kw * g[S_DW];
            if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W) {
                const int64_t i = (id * H + ih) * W + iw;
                lane[inverse ? i : q] = (int32_t)(inverse ? q : i);
                m |= 1u << (inverse ? i : q);
            }
        }
        idx[t] = _mm512_loadu_si512(lane);
        ok[t] = (__mmask16)m;
    }
}

/* The same for planes of at most 64 elements in and out (a ResNet's 7x7 and 8x8 planes, 8x8 -> 4x4 at stride 2): a
 * plane in four registers, each 16-lane chunk j of a tap t's destination (im2col: its output positions; col2im: the
 * input elements) picked from the 64-element source plane by at most two two-register permutations. Entry t * chunks
 * + j: idx lanes the source element's index modulo 32, lo the lanes reading source elements 0-31 (registers 0 and
 * 1), hi those reading 32-63 (registers 2 and 3). XCONV_PLANE64_ENTRIES bounds taps x chunks (the tables' stack). */
#define XCONV_PLANE64_ENTRIES 96

typedef struct {
    __m512i idx[XCONV_PLANE64_ENTRIES];
    __mmask16 lo[XCONV_PLANE64_ENTRIES], hi[XCONV_PLANE64_ENTRIES];
    __mmask16 last;         /* the store mask of the destination's last chunk */
} xconv_perms64;

static void xconv_plane_perms64(const int64_t *g, int inverse, int64_t chunks, xconv_perms64 *perms) {
    __m512i *idx = perms->idx;
    __mmask16 *lo = perms->lo, *hi = perms->hi;
    const int64_t D = g[S_D], H = g[S_H], W = g[S_W], OD = g[S_OD], OH = g[S_OH], OW = g[S_OW];
    const int64_t KD = g[S_KD], KH = g[S_KH], KW = g[S_KW], Q = OD * OH * OW, dst_size = inverse ? D * H * W : Q;
    perms->last = (__mmask16)(dst_size % 16 ? (1u << (dst_size % 16)) - 1 : 0xFFFF);
    for (int64_t t = 0; t < KD * KH * KW; t++) {
        const int64_t kd = t / (KH * KW), kh = t / KW % KH, kw = t % KW;
        int32_t lane[64] = {0};
        uint64_t m_lo = 0, m_hi = 0;
        for (int64_t q = 0; q < Q; q++) {
            const int64_t od = q / (OH * OW), oh = q / OW % OH, ow = q % OW;
            const int64_t id = od * g[S_SD] - g[S_PD] + kd * g[S_DD], ih = oh * g[S_SH] - g[S_PH] + kh * g[S_DH];
            const int64_t iw = ow * g[S_SW] - g[S_PW] + kw * g[S_DW];
            if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W) {
                const int64_t i = (id * H + ih) * W + iw, dst = inverse ? i : q, src = inverse ? q : i;
                lane[dst] = (int32_t)(src & 31);
                if (src < 32) m_lo |= 1ull << dst;
                else m_hi |= 1ull << dst;
            }
        }
        for (int64_t j = 0; j < chunks; j++) {
            idx[t * chunks + j] = _mm512_loadu_si512(lane + 16 * j);
            lo[t * chunks + j] = (__mmask16)(m_lo >> (16 * j));
            hi[t * chunks + j] = (__mmask16)(m_hi >> (16 * j));
        }
    }
}

/* One 16-lane chunk picked from the 64-element plane r[0..3] by entry (idx, lo, hi): zero where neither mask is set. */
static inline __m512 xconv_pick64(const __m512 *r, __m512i idx, __mmask16 lo, __mmask16 hi) {
    __m512 v = _mm512_maskz_permutex2var_ps(lo, r[0], idx, r[1]);
    if (hi)
        v = _mm512_mask_mov_ps(v, hi, _mm512_maskz_permutex2var_ps(hi, r[2], idx, r[3]));
    return v;
}

/* The n (<= 64) contiguous floats at p into four registers, zeros past n (nothing read there). */
static inline void xconv_load64(const float *p, int64_t n, __m512 *r) {
    for (int64_t k = 0; k < 4; k++) {
        const int64_t left = n - 16 * k;
        r[k] = left <= 0 ? _mm512_setzero_ps()
                         : _mm512_maskz_loadu_ps((__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1), p + 16 * k);
    }
}
#endif

#define T float
#define SUF _f32
#define XCONV_MASKED_ROWS XCONV_HAVE_MASKED_ROWS
#include "small_cols_impl.h"
#undef XCONV_MASKED_ROWS
#undef T
#undef SUF

#define T double
#define SUF _f64
#define XCONV_MASKED_ROWS 0
#include "small_cols_impl.h"
#undef XCONV_MASKED_ROWS
#undef T
#undef SUF
