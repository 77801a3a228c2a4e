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
