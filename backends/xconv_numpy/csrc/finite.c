/* Whether arrays hold only finite values (no NaN, no infinity), for the paths' non-finite detours (../finite.py).
 * One pass over the elements' bits, without branches: an element whose exponent bits are all set is a NaN or an
 * infinity; the tests OR-reduced, which the compiler vectorizes on every build (a double's exponent read from its
 * high 32-bit word). NumPy's float32 sum, the check before, read 4 G elements/s; its answer could also be wrong the
 * other way round (finite values whose sum overflowed, then checked again). The answer depends on the values only. */
#include <stdint.h>
#include <string.h>

#include "template.h"

#define T float
#define SUF _f32
#define W uint32_t
#define EXP 0x7f800000u
#define HIGH 0
#include "finite_impl.h"
#undef T
#undef SUF

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HIGH 1                  /* the high word second in memory */
#define W uint32_t
#define EXP 0x7ff00000u
#else
#define HIGH 0
#define W uint64_t
#define EXP 0x7ff0000000000000ull
#endif
#define T double
#define SUF _f64
#include "finite_impl.h"
#undef T
#undef SUF
