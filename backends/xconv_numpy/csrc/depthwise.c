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

/* geo: C, m, H, W, OH, OW, Lh, Lw, K, nRw, nslots, need_dx, need_dw, need_db, x strides (n, c, h, w), dy strides
 * (n, co, h, w) (strides in elements), the width stride, whether the weights are finite (flat dx), the largest tap
 * offset F; tab: per input row its row slot and index (2H), then per
 * column slot its run of columns (3 nRw) */
enum { G_C, G_M, G_H, G_W, G_OH, G_OW, G_LH, G_LW, G_K, G_NRW, G_NSLOTS, G_DX, G_DW, G_DB, G_XS, G_DYS = G_XS + 4,
       G_SW = G_DYS + 4, G_FLATDX, G_F };

#define T float
#define SUF f32
#include "depthwise_impl.h"
#undef T
#undef SUF

#define T double
#define SUF f64
#include "depthwise_impl.h"
#undef T
#undef SUF
