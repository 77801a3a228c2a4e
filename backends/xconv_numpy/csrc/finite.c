/* Whether arrays hold only finite values (no NaN, no infinity), for the paths' non-finite detours (../columns.py,
 * ../finite.py). One pass over the elements' bits, without branches: the largest magnitude's bits (sign cleared)
 * against the exponent's all-ones, an integer max reduction the compiler vectorizes (NumPy's float32 sum, the check
 * before, read 4 G elements/s; its answer could also be wrong the other way round: finite values whose sum
 * overflowed, then checked again). The answer depends on the values only. */
#include <stdint.h>
#include <string.h>

/* 1 when the n floats at p are all finite, else 0. */
int xconv_all_finite_f32(const float *p, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, p + i, sizeof b);
        b &= 0x7fffffffu;
        m = b > m ? b : m;
    }
    return m < 0x7f800000u;
}

/* 1 when the n doubles at p are all finite, else 0. */
int xconv_all_finite_f64(const double *p, int64_t n) {
    uint64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t b;
        memcpy(&b, p + i, sizeof b);
        b &= 0x7fffffffffffffffull;
        m = b > m ? b : m;
    }
    return m < 0x7ff0000000000000ull;
}
