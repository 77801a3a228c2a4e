/* The one template idiom of the compiled loops (see kernels.c).
 *
 * A template is a header that the including file instantiates by defining its parameters, including it, and
 * undefining them again: `#define T float` / `#define SUF _f32` / `#include "depthwise_impl.h"` / `#undef ...`.
 * Inside a template, XCONV_T(name) is name with SUF pasted on (xconv_depthwise_fprop -> xconv_depthwise_fprop_f32),
 * and XCONV_CAT is the only token paste. Templates of direct_conv.c take block shapes (NR, NV) the same way.
 * Not templates: always_inline functions called with constants (depthwise_impl.h's dots, axpys), and three
 * statement macros expanded inside functions (vectors.h's STAGE, small_grid_impl.h's SG_DW_BODY, direct_dx_block.h's
 * DX_TAP_RANGE), kept because written as inline functions GCC compiles them differently (the loops' machine code is
 * unchanged by the move to this idiom; see issue 23; DX_TAP_RANGE: every function of the three builds the same
 * instructions as its two written-out copies). */
#ifndef XCONV_TEMPLATE_H
#define XCONV_TEMPLATE_H

#define XCONV_CAT_(a, b) a##b
/* a and b (after macro expansion) pasted into one token */
#define XCONV_CAT(a, b) XCONV_CAT_(a, b)
/* name with the current instantiation's suffix SUF */
#define XCONV_T(name) XCONV_CAT(name, SUF)

#endif
