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
