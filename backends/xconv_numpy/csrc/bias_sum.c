/* The bias gradient's sum (see ../bias.py), for float64, float32, float16 and bfloat16 grad_y read in place.
 *
 *   out[o] = sum over n in order of (0.0 + pairwise(grad_y[n, o, :]))      (a NaN: the canonical NaN)
 *
 * where the row grad_y[n, o, :] (its spatial positions in C order, any element strides) is converted to double
 * element by element and pairwise(...) is NumPy's pairwise summation (numpy/_core/src/umath/loops_utils.h.src,
 * @TYPE@_pairwise_sum, PW_BLOCKSIZE 128) of those doubles; 0.0 + ... is the float add reduction's start (its
 * identity, +0.0, then one reduce-loop call over the whole row: NumPy 2.x neither copies the first element nor
 * splits a contiguous float64 row at the buffer size), and the sum over n is np.add.accumulate's order. That is
 * bias.grad_bias's NumPy route bit for bit (tests/test_bias_order.py checks it against this machine's NumPy).
 *
 * Only additions of doubles in the order written: nothing here multiplies (so -ffp-contract cannot fuse) and the
 * build never passes -ffast-math / -fassociative-math, so the compiler may not reassociate. It may still swap an
 * add's operands, which decides only which of two NaNs the add returns: hence the canonical NaN. */
#include <stdint.h>
#include <string.h>

#include "layout.h"
#include "template.h"

/* NumPy's PW_BLOCKSIZE: rows of at most this many elements are summed by eight accumulators. */
#define XCONV_PW_BLOCK 128

/* eight doubles: the eight accumulators of a block, lane k the k-th */
typedef double xconv_v8d __attribute__((vector_size(64)));

/* A walk through one row in C order: the row's first element (bytes), its spatial dims (d, h, w) and element
 * strides, and the position of the next element. */
typedef struct {
    const char *row;
    int64_t H, W, sd, sh, sw;
    int64_t d, h, w;
} xconv_bias_walk;

/* float16 bits -> double, exactly (NaN payloads kept, as NumPy's npy_half_to_double does). */
static inline double xconv_half_to_double(uint16_t h) {
    union { uint32_t u; float f; } v;
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {                                        /* zero or subnormal: m * 2^-24, exact in float */
        v.f = (float)m * 0x1p-24f;
        v.u |= sign;
    } else if (e == 31) {
        v.u = sign | 0x7f800000u | (m << 13);            /* inf or NaN (payload kept) */
    } else {
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    }
    return (double)v.f;
}

/* bfloat16 bits -> double, exactly (the upper half of a float). */
static inline double xconv_bf16_to_double(uint16_t b) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return (double)v.f;
}

/* double first: the other instances' walks sum their converted blocks with its leaf */
#define T double
#define SUF _f64
#define XCONV_TO_DOUBLE(v) (v)
#include "bias_sum_impl.h"
#undef T
#undef SUF
#undef XCONV_TO_DOUBLE

#define T float
#define SUF _f32
#define XCONV_TO_DOUBLE(v) ((double)(v))
#include "bias_sum_impl.h"
#undef T
#undef SUF
#undef XCONV_TO_DOUBLE

#define T uint16_t
#define SUF _f16
#define XCONV_TO_DOUBLE(v) xconv_half_to_double(v)
#include "bias_sum_impl.h"
#undef T
#undef SUF
#undef XCONV_TO_DOUBLE

#define T uint16_t
#define SUF _bf16
#define XCONV_TO_DOUBLE(v) xconv_bf16_to_double(v)
#include "bias_sum_impl.h"
#undef T
#undef SUF
#undef XCONV_TO_DOUBLE
