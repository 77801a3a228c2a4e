/* Depthwise convolution loops for the NumPy backend (see ../direct.py), in float and double.
 *
 * One (sample, input channel) plane at a time, on the polyphase grid of the zero-padded input (per dim, phase r
 * holds x_pad[a * s + r]; only the phases some tap reads are kept, so scratch does not grow with the stride).
 * Every term of every sum is one the convolution defines: no position outside dy's box, and no grid position
 * beyond the padded input, is ever multiplied (an infinity never meets a zero of the grid). Each output element
 * is computed by one call in a fixed order, so results are bitwise reproducible for a given build.
 */
#include <stdint.h>
#include <string.h>

#include "layout.h"
#include "template.h"

/* geo: csrc/layout.h's XCONV_DEPTHWISE_GEO (G_*); tab: per input row its row slot and index (2H), then per
 * column slot its run of columns (3 nRw) */

#define T float
#define TI int32_t
#define SUF _f32
#include "depthwise_impl.h"
#undef T
#undef TI
#undef SUF

#define T double
#define TI int64_t
#define SUF _f64
#include "depthwise_impl.h"
#undef T
#undef TI
#undef SUF
