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

#define T float
#define SUF _f32
#include "small_cols_impl.h"
#undef T
#undef SUF

#define T double
#define SUF _f64
#include "small_cols_impl.h"
#undef T
#undef SUF
