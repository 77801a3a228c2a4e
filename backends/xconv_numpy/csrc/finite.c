/* Whether arrays hold only finite values (no NaN, no infinity), for the paths' non-finite detours (../finite.py).
 * One pass over the elements' bits, without branches: the largest magnitude's bits (sign cleared) against the
 * exponent's all-ones, an integer max reduction the compiler vectorizes (NumPy's float32 sum, the check before, read
 * 4 G elements/s; its answer could also be wrong the other way round: finite values whose sum overflowed, then
 * checked again). The answer depends on the values only. */
#include <stdint.h>
#include <string.h>

#include "template.h"

#define T float
#define SUF _f32
#define U uint32_t
#define ABS 0x7fffffffu
#define INF 0x7f800000u
#include "finite_impl.h"
#undef T
#undef SUF

#define T double
#define SUF _f64
#define U uint64_t
#define ABS 0x7fffffffffffffffull
#define INF 0x7ff0000000000000ull
#include "finite_impl.h"
#undef T
#undef SUF
