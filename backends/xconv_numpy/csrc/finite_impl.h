/* The finiteness check of finite.c for one element type T (suffix SUF): U its unsigned integer of T's width, ABS the
 * mask clearing the sign bit, INF the bits of +infinity. The template undefines U, ABS and INF at its end. */

/* 1 when the n elements at p are all finite, else 0. */
int XCONV_T(xconv_all_finite)(const T *p, int64_t n) {
    U m = 0;
    for (int64_t i = 0; i < n; i++) {
        U b;
        memcpy(&b, p + i, sizeof b);
        b &= ABS;
        m = b > m ? b : m;
    }
    return m < INF;
}

#undef U
#undef ABS
#undef INF
